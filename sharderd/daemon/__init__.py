"""``sharderd run``: the inbox daemon and its parts (intake, journal, outbox, sd_notify)."""

from __future__ import annotations
