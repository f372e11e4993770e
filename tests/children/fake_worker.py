"""A scripted stand-in for ``python -m sharderd.backends.worker REQUEST RESULT``.

Usage: fake_worker.py MODE REQUEST RESULT, where MODE is one of
ok, oom, claim-timeout, no-result, truncated, not-object, exit3, segv, hang
(hang writes its pid to "hanging" beside RESULT once it runs).
"""

import json
import os
import signal
import sys
from pathlib import Path

mode, request_path, result_path = sys.argv[1:4]
with open(request_path) as f:
    request = json.load(f)
print(f"fake worker: {mode} for {request['model']}", file=sys.stderr, flush=True)


def write_result(data: object) -> None:
    with open(result_path + ".tmp", "w") as f:
        json.dump(data, f)
    Path(result_path + ".tmp").replace(result_path)


if mode == "ok":
    write_result(
        {
            "outcome": "ok",
            "message": f"compiled {request['model']}",
            "artifact": request["artifact"],
        }
    )
elif mode == "oom":
    write_result(
        {
            "outcome": "oom",
            "message": "Out of memory on tile 17",
            "oom": {
                "kind": "tile",
                "device": 1,
                "tile": 17,
                "bytes_used": 700000,
                "tile_bytes": 638976,
            },
        }
    )
elif mode == "claim-timeout":
    write_result({"outcome": "timeout", "message": "I am not allowed to say this"})
elif mode == "no-result":
    pass
elif mode == "truncated":
    with open(result_path, "w") as f:
        f.write('{"outcome": "ok", "mess')
elif mode == "not-object":
    write_result(["ok"])
elif mode == "exit3":
    print("poprt: fatal: no IPU available", file=sys.stderr, flush=True)
    sys.exit(3)
elif mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "hang":
    ready = Path(result_path).parent / "hanging"
    ready.with_name("hanging.tmp").write_text(str(os.getpid()))
    ready.with_name("hanging.tmp").replace(ready)
    while True:
        signal.pause()
else:
    sys.exit(f"unknown mode {mode}")
