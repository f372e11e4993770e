"""``sharderd``: the command line (``commands``), the daemon's status as files show it (``status``)
and the live progress of ``sharderd shard`` (``progress``).

``main`` is the console script; ``python -m sharderd.cli ARGS`` runs the same through ``__main__``.
Exit codes (other tools rely on them): 0 done, 1 failed (compile or verification), 2 bad input or
usage, 3 does not fit, 4 backend unavailable.
"""

from __future__ import annotations

from sharderd.cli.commands import main

__all__ = ["main"]
