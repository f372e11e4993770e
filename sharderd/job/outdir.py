"""What a local job checks before it starts: the model can be opened, the output folder holds no
earlier result. The files every result folder gets are named here (``REPORT_FILES``)."""

from __future__ import annotations

import os
from pathlib import Path

from sharderd.errors import ModelInvalidError

__all__ = ["REPORT_FILES", "check_model_file", "occupied"]

REPORT_FILES = ("report.json", "report.md", "report.html")
"""Written into every result folder, also of a job that failed after reading the model."""


def occupied(out_dir: Path, stem: str) -> str | None:
    """Why writing the results into ``out_dir`` would overwrite an earlier result, or None when it
    would not: the folder is missing, or holds none of the files every result has (a model's own
    folder is a fine ``out``). The caller refuses, naming its own way to insist."""
    # os.path's tests say False for a path that cannot be looked up (too long, say): writing it
    # then fails with the cause (OutputWriteError), not here with a traceback
    if not os.path.lexists(out_dir):
        return None
    if not os.path.isdir(out_dir):  # noqa: PTH112 (Path.is_dir raises on a name too long)
        return f"output folder {out_dir} exists and is not a folder"
    names = (f"{stem}.sharded.onnx", f"{stem}.sharding.yaml", *REPORT_FILES)
    found = [name for name in names if os.path.lexists(out_dir / name)]
    if found:
        return f"output folder {out_dir} already holds a result ({', '.join(found)}): writing would replace it"
    return None


def check_model_file(path: Path) -> None:
    """A model that cannot be opened is said at once, before any progress event.

    Raises:
        ModelInvalidError: it is missing, a folder, or unreadable.
    """
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None
