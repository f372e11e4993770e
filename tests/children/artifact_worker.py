"""A stand-in worker that writes a small artifact and an ``ok`` result.

Usage: artifact_worker.py REQUEST RESULT. The artifact's bytes are the request's model path
repeated, so a test can predict them; stderr gets two lines the daemon log should carry.
"""

import json
import sys
from pathlib import Path

request_path, result_path = sys.argv[1:3]
request = json.loads(Path(request_path).read_text())
print("artifact worker: compiling", file=sys.stderr, flush=True)
Path(request["artifact"]).write_bytes(b"popef:" + request["model"].encode() * 100)
print("artifact worker: done", file=sys.stderr, flush=True)
tmp = Path(result_path + ".tmp")
tmp.write_text(
    json.dumps({"outcome": "ok", "message": "compiled", "artifact": request["artifact"]})
)
tmp.replace(result_path)
