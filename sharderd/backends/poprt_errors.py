"""Turn the text of a failed PopRT compile into an outcome the search can act on.

PopRT raises ``RuntimeError`` whose text is Poplar's or PopART's message, sometimes behind a
prefix such as ``"Memory allocation error : "`` and sometimes over several lines, so every form
is found by searching, never by an anchored match. Out-of-memory texts become ``oom`` with as
much placement as the text carries; PopART's validation texts become ``invalid`` with a one-line
summary that says what to change; anything else is ``invalid`` with the text itself, because a
compile that failed for an unknown reason must not be retried as if memory were the cause.
Message forms and sources: ``../shared/reference/poprt-facts.md`` §1-§2.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sharderd.backends.protocol import OomInfo, Outcome

__all__ = ["parse_compile_error"]

_TILE = re.compile(
    r"Out of memory on tile (\d+):\s*(\d+) bytes(?: used)?(?: but tiles only have (\d+) bytes of memory)?"
)
_VARIABLES = re.compile(
    r"Out of memory: Cannot fit all variable data onto one or more tiles\.?"
    r"(?:\s*Profile saved to:\s*(\S+))?"
)
_CODE = re.compile(r"tile (\d+) _poplar_start must be 0 not (\d+) bytes from the start of memory")
_EXCHANGE = re.compile(
    r"Tile (\d+) receives more data than it has total memory in exchange '([^']*)'"
)
_STREAM = re.compile(r"Out of memory\. Single stream of length (\d+) in bufferIndex (\d+)")

_MAX_LISTED = 5
_MAX_TEXT = 2000


def parse_compile_error(text: str, tiles_per_device: int) -> tuple[Outcome, OomInfo | None, str]:
    """Classify a compile failure: ``("oom", info, summary)`` or ``("invalid", None, summary)``.

    ``tiles_per_device`` maps Poplar's global tile index to a device (IPU i owns tiles
    ``[i*T, (i+1)*T)``); 0 leaves ``device`` unknown. When several out-of-memory texts appear,
    the first "Out of memory on tile" form wins because it carries a tile and a byte count.
    """
    oom = _parse_oom(text, tiles_per_device)
    if oom is not None:
        return "oom", oom[0], oom[1]
    for pattern, summarise in _VALIDATION:
        match = pattern.search(text)
        if match is not None:
            return "invalid", None, summarise(match, text)
    return "invalid", None, _clip(text.strip()) or "compile failed without a message"


def _parse_oom(text: str, tiles: int) -> tuple[OomInfo, str] | None:
    match = _TILE.search(text)
    if match is not None:
        tile, used = int(match[1]), int(match[2])
        capacity = int(match[3]) if match[3] else None
        info = OomInfo("tile", _device(tile, tiles), tile, used, capacity)
        of = f" of {capacity}" if capacity is not None else ""
        return info, f"out of memory{_on(info)}: tile {tile} needs {used} bytes{of}"
    found = [(m.start(), build, m) for pattern, build in _OTHER_OOM if (m := pattern.search(text))]
    if not found:
        return None
    _, build, match = min(found, key=lambda f: f[0])
    return build(match, tiles)


def _variables(match: re.Match[str], tiles: int) -> tuple[OomInfo, str]:
    profile = f" (profile: {match[1]})" if match[1] else ""
    return OomInfo("variables"), (
        "out of memory: variable data does not fit on one or more tiles; Poplar named no tile"
        f" (its debug.allowOutOfMemory form){profile}"
    )


def _code(match: re.Match[str], tiles: int) -> tuple[OomInfo, str]:
    tile = int(match[1])
    info = OomInfo("code", _device(tile, tiles), tile)
    return (
        info,
        f"out of code memory{_on(info)}: tile {tile} has too much code ({match[2]} bytes before _poplar_start)",
    )


def _exchange(match: re.Match[str], tiles: int) -> tuple[OomInfo, str]:
    tile = int(match[1])
    info = OomInfo("exchange", _device(tile, tiles), tile)
    return (
        info,
        f"out of exchange memory{_on(info)}: tile {tile} receives more than it holds in exchange '{match[2]}'",
    )


def _stream(match: re.Match[str], tiles: int) -> tuple[OomInfo, str]:
    return OomInfo("stream"), (
        f"out of memory for a host stream: a single stream of {match[1]} bytes (buffer {match[2]}) does not fit"
    )


_OTHER_OOM: tuple[
    tuple[re.Pattern[str], Callable[[re.Match[str], int], tuple[OomInfo, str]]], ...
] = (
    (_VARIABLES, _variables),
    (_CODE, _code),
    (_EXCHANGE, _exchange),
    (_STREAM, _stream),
)
"""Out-of-memory forms other than the tile form; the earliest in the text wins."""


def _device(tile: int, tiles: int) -> int | None:
    return tile // tiles if tiles > 0 else None


def _on(info: OomInfo) -> str:
    return f" on device {info.device}" if info.device is not None else ""


# --- PopART validation texts -------------------------------------------------------------------


_OP = re.compile(r"Op\(([^\s(),]+) \(|Op\((ai\.[^,)]+)")


def _op_names(text: str) -> list[str]:
    """Node names from PopART's ``Op(<name> (ai.onnx.<Type>:<v>), ...)`` debug names."""
    return [named or opid for named, opid in _OP.findall(text)]


def _line_names(text: str) -> list[str]:
    """One op per line, as PopART lists them; the node name where the line carries one."""
    return [(_op_names(line) or [line.strip()])[0] for line in text.splitlines() if line.strip()]


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return f"{shown}, … ({more} more)" if more > 0 else shown


def _mixed(match: re.Match[str], text: str) -> str:
    tail = text[match.end() :]
    _, _, unannotated = tail.partition("Ops with no virtual graph id :")
    names = _line_names(unannotated)
    which = f"; without: {_listed(names)}" if names else ""
    return f"mixed annotation: some nodes have __ipu_number and some do not; every node needs one{which}"


def _unannotated(match: re.Match[str], text: str) -> str:
    return "virtual_graph_mode is manual but no node has an __ipu_number attribute"


def _bad_vgraph(match: re.Match[str], text: str) -> str:
    ops = _op_names(match[1]) or [match[1].split()[-1]]
    return f"node {ops[-1]} is on IPU {match[2]}, outside 0..{int(match[3]) - 1} (num_ipus = {match[3]})"


def _vgraphs_off(match: re.Match[str], text: str) -> str:
    return f"num_ipus = {match[2]} needs virtual_graph_mode 'manual' (virtual graphs are off)"


def _pipelining_needs(match: re.Match[str], text: str) -> str:
    return (
        f"pipelining needs more than one IPU in use (found {match[1]}) and virtual_graph_mode"
        " other than off"
    )


def _partial_stages(match: re.Match[str], text: str) -> str:
    names = _line_names(text[match.end() :])
    which = f": {_listed(names)}" if names else ""
    return f"some nodes lack __pipeline_stage; every node needs one when any has one{which}"


def _stage_spans(match: re.Match[str], text: str) -> str:
    nodes = _listed(_op_names(match[1])) or _clip(match[1], 200)
    return (
        f"pipeline stage {match[2]} spans IPUs {match[3]}; all nodes of one stage must share"
        f" one __ipu_number (nodes: {nodes})"
    )


def _missing_stage(match: re.Match[str], text: str) -> str:
    return f"pipeline stages must be numbered 0..{int(match[1]) - 1} without gaps; stage {match[2]} is missing"


def _bad_stage(match: re.Match[str], text: str) -> str:
    return f"a node has the negative pipeline stage {match[1]}"


def _depth(match: re.Match[str], text: str) -> str:
    return f"batches_per_step must be at least the number of pipeline stages ({match[1]})"


def _depth_per_ipus(match: re.Match[str], text: str) -> str:
    return f"batches_per_step must be at least {match[1]} for {match[2]} IPUs"


def _stream_onto_one(match: re.Match[str], text: str) -> str:
    return "a graph input is consumed on several IPUs; with pipelining each input may feed one IPU only"


def _io_tiles(match: re.Match[str], text: str) -> str:
    return f"num_io_tiles = {match[1]} is invalid: use 0 or an even number >= 32"


def _amp(match: re.Match[str], text: str) -> str:
    return "available_memory_proportion must be in (0, 1]"


_VALIDATION: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], str], str]], ...] = (
    (
        re.compile(
            r"Either all Ops (?:in the main graph )?must have their virtual graph ids set, or none must\."
        ),
        _mixed,
    ),
    (
        re.compile(r"virtualGraphMode is VirtualGraphMode::Manual, but no Ops have been annotated"),
        _unannotated,
    ),
    (
        re.compile(
            r"(.{1,300}?) has been assigned to an invalid virtual graph (-?\d+)\. numIPUs = (\d+)"
        ),
        _bad_vgraph,
    ),
    (
        re.compile(
            r"replicated graph count \((\d+)\) needs to be equal to the number of IPUs \((\d+)\)"
        ),
        _vgraphs_off,
    ),
    (re.compile(r"Pipelining requires more than 1 IPU \(currently (\d+)\)"), _pipelining_needs),
    (
        re.compile(
            r"Only some ops have had their pipeline stage set\. Ops missing the pipeline stage:"
        ),
        _partial_stages,
    ),
    (
        re.compile(
            r"Ops (.*?) have the same pipeline stage (-?\d+), but different virtual graph ids (\S.*?)\. All ops",
            re.S,
        ),
        _stage_spans,
    ),
    (re.compile(r"contains (\d+) stages, but stage (\d+) is missing"), _missing_stage),
    (re.compile(r"has bad pipeline stage (-?\d+)"), _bad_stage),
    (
        re.compile(
            r"depth \(batchesPerStep\) must equal at least the number of pipeline stages \((\d+)\)"
        ),
        _depth,
    ),
    (
        re.compile(r"depth \(batchesPerStep\) must be at least (\d+) for (\d+) IPUs"),
        _depth_per_ipus,
    ),
    (
        re.compile(r"stream tensors can only be streamed directly onto a single IPU"),
        _stream_onto_one,
    ),
    (re.compile(r"(-?\d+) is an invalid number of IO tiles"), _io_tiles),
    (re.compile(r"availableMemoryProportion must be in \(0,\s*1\]"), _amp),
)


def _clip(text: str, limit: int = _MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
