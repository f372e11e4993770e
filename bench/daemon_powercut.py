"""Power cuts at every point of a real ``sharderd run``, each followed by a restart.

``tests/daemon/test_powercut.py`` checks the state every cut leaves and restarts at the cut of each
window; this restarts at every cut. One model is traced through a daemon started on a fresh state
folder (``tests/powercut.py``: every file operation of the daemon process, with inodes); for each
operation that changes what survives, the tree a power cut right after it leaves is built (only
fsynced entries and bytes survive), a daemon is started on it, the same bytes are dropped again under
another name, and the end state is checked: the model not lost, its content published once (the
second drop a duplicate), every report in ``done/`` whole. A cut that breaks a promise is reported
with the operation it followed; the run does not stop at the first.

    python bench/daemon_powercut.py             # every cut (about 120), a restart each
    python bench/daemon_powercut.py --every 5   # every fifth cut
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import OUT, machine, machine_markdown, markdown_table, write_json

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "daemon"), str(REPO / "tests"), str(REPO)]

from powercut import cuts, materialize  # noqa: E402  (after the path set-up)
from test_powercut import check_after_cut, check_cut_state, traced_run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=1, help="restart at every Nth cut (default 1)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="kept afterwards (default: temp)"
    )
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="sharderd-powercut-"))
    root = work / "root"
    (root / "models").mkdir(parents=True)
    started = time.monotonic()
    trace, final, data = traced_run(root)
    points = list(cuts(trace))[:: args.every]
    findings: list[str] = []
    for n, k in enumerate(points, start=1):
        print(f"cut {n}/{len(points)} (after op {k} of {len(trace)})", file=sys.stderr, flush=True)
        shutil.rmtree(root, ignore_errors=True)
        try:
            lost = materialize(trace, k, final, root)
            check_cut_state(root, data, lost)
            check_after_cut(root, data, lost)
        except AssertionError as exc:
            findings.append(
                f"after op {k} ({trace[k - 1]['op']} {trace[k - 1].get('path') or trace[k - 1].get('dst')}): {str(exc)[:300]}"
            )
    seconds = time.monotonic() - started
    info = machine()
    write_json(
        OUT / "daemon_powercut.json",
        {
            "ops": len(trace),
            "cuts": len(points),
            "findings": findings,
            "seconds": round(seconds, 1),
            "machine": info,
        },
    )
    if args.workdir is None and not findings:
        shutil.rmtree(work)
    held = (
        "every cut: model kept (not in lost+found), published once, the same bytes dropped again "
        "a duplicate, reports in done/ whole"
        if not findings
        else f"{len(findings)} cuts broke a promise: " + "; ".join(findings[:10])
    )
    command = "`python bench/daemon_powercut.py" + (
        f" --every {args.every}`" if args.every > 1 else "`"
    )
    print(
        markdown_table(
            (
                "Run",
                "Operations traced",
                "Cuts restarted",
                "Broken",
                "What held",
                "Time",
                "Command",
            ),
            [
                [
                    "power cuts",
                    len(trace),
                    len(points),
                    len(findings),
                    held,
                    f"{seconds:.0f} s",
                    command,
                ]
            ],
        )
    )
    print()
    print(machine_markdown(info))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
