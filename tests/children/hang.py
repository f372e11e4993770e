"""Sleep until killed; optionally ignore SIGTERM and fork a grandchild that does the same.

Usage: hang.py READY_FILE [--ignore-term] [--grandchild] [--exit]
Writes "<pid> <grandchild pid or 0>" to READY_FILE (atomically) once set up.
With --exit the leader exits 0 after setup, leaving the grandchild behind.
"""

import os
import signal
import sys
from pathlib import Path

ready, flags = sys.argv[1], set(sys.argv[2:])
if "--ignore-term" in flags:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = 0
if "--grandchild" in flags:
    grandchild = os.fork()
    if grandchild == 0:
        while True:
            signal.pause()
with open(ready + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild}\n")
Path(ready + ".tmp").replace(ready)
if "--exit" in flags:
    sys.exit(0)
while True:
    signal.pause()
