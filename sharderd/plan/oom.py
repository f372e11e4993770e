"""What an out-of-memory compile told the search: the observation type the backends produce.

It lives in the engine (``plan/``) because the search learns from it; ``backends/`` builds it
from compiler texts and ships it across the attempt process boundary as plain JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["OomInfo", "OomKind"]

OomKind = Literal["tile", "variables", "code", "exchange", "stream"]


@dataclass(frozen=True, slots=True)
class OomInfo:
    """What an out-of-memory failure told us. Fields are None when the text has no number."""

    kind: OomKind
    """``tile``: "Out of memory on tile T: U bytes used..."; ``variables``: the numberless form."""
    device: int | None = None
    tile: int | None = None
    """Global tile index as Poplar prints it."""
    bytes_used: int | None = None
    """Total bytes on that tile (not the excess)."""
    tile_bytes: int | None = None
    """Tile capacity as printed (638976 on Mk2)."""
