"""Append "start NAME" and, after a short stretch of work, "end NAME" to LOG (O_APPEND).

Usage: marker.py LOG NAME
"""

import os
import sys
import time

log, name = sys.argv[1], sys.argv[2]


def mark(what: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {name}\n".encode())
    finally:
        os.close(fd)


mark("start")
time.sleep(0.2)  # noqa: TID251 - stands in for work that overlaps a sibling's; nothing waits on it
mark("end")
