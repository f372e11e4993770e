"""``python -m sharderd.cli ARGS``: the same as the ``sharderd`` console script."""

from __future__ import annotations

import sys

from sharderd.cli import main

sys.exit(main())
