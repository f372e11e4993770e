"""The seed's auto-sharding search (PopRT's ``tools/auto_sharding.py``), re-implemented as a baseline.

Written from the algorithm's description, not its code, so ``bench/compiles.py`` can count its
compiles against the same fake compiler as sharderd's. It keeps the seed's behaviour, weaknesses
included, because they are what the comparison is about:

- blocks are grown backwards from "candidate" nodes (more than one non-initializer input), and
  blocks lighter than the per-candidate average in weight bytes *or* FLOPs are merged into the next;
- the first split cuts on cumulative weight bytes alone (a shared initializer is counted once per
  consuming node), and may use fewer IPUs than it was given;
- block ancestry is one level deep, so most pairs of blocks in a chain look "parallel", and the
  left-over block is parallel to everything;
- on ``Out of memory on tile T`` it moves a boundary block of IPU ``T // tiles`` to a neighbouring
  or "parallel" IPU and queues every split not tried before (breadth first, as its worker queue
  does), exploring only from splits whose OOM is no worse than the best seen;
- when nothing compiles it retries the least-overfull split at ``available_memory_proportion`` 0.3,
  then 0.1, and gives up.

Its crash bugs are not reproduced: a first success is returned (the seed raises a TypeError there),
an empty cut list keeps one group (the seed indexes ``[-1]``), a compile error without a tile number
is recorded instead of killing a worker, the left-over block is never named as a sharding point
(PopRT's Sharder rejects the name "Remained"), and tiles per IPU come from ``--tiles`` rather than
the hard-coded 1472. Compiles run one at a time (the seed runs two workers, so it may have one more
compile in flight when the first success lands); ``--max-compiles`` bounds the search.

    PYTHONPATH=tests/fake_poprt python bench/seed_search.py MODEL --num-ipus 5 --tiles 24
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

__all__ = [
    "Block",
    "CompileResult",
    "Group",
    "SeedResult",
    "build_blocks",
    "first_split",
    "moves",
    "search",
    "sharding_info",
]

SKIPPED_OPS = frozenset({"Reshape", "Slice", "Tile", "Expand"})
"""Ops whose initializer inputs the seed does not count as weights (shape operands)."""
LEFTOVER = "Remained"
"""The seed's name for the block of nodes no candidate reached; not a node of the model."""
NEAR_LIMIT_BYTES = 641_000
"""The seed keeps exploring from every split while its best OOM is this close to a tile's 638976."""
AMP_FALLBACKS = (0.3, 0.1)
_OOM_TEXT = re.compile(r"Out of memory on tile (\d+): (\d+) bytes")
IPU_ATTR = "__ipu_number"


@dataclass(frozen=True, slots=True)
class Block:
    """One of the seed's "subgraphs": a candidate node and the ancestors nobody had claimed."""

    id: int
    start: str
    nodes: tuple[str, ...]
    weight_bytes: float
    flops: float
    parents: frozenset[int]
    """Blocks whose start node directly feeds a node of this one (one level, as in the seed)."""
    kids: frozenset[int]
    included: frozenset[int]
    """What the seed believes this block reaches: its parents only (the transitive union is lost)."""
    parallel: frozenset[int]


@dataclass(frozen=True, slots=True)
class Group:
    """Blocks on one IPU; ``starts`` become that IPU's sharding points (none on the last IPU)."""

    blocks: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    weight_bytes: float = 0.0
    flops: float = 0.0
    last: bool = False


Split = tuple[Group, ...]


@dataclass(frozen=True, slots=True)
class CompileResult:
    amp: float | None
    ok: bool
    tile: int | None
    device: int | None
    bytes_used: int | None
    error: str | None
    seconds: float


@dataclass(frozen=True, slots=True)
class SeedResult:
    status: str
    """``compiled`` or ``gave_up``."""
    compiles: tuple[CompileResult, ...]
    split: Split | None
    """The split that compiled (or the least-overfull one when none did)."""
    assignment: Mapping[str, int] = field(default_factory=dict)
    """IPU of every node as the Sharder annotated the compiled split."""
    blocks: tuple[Block, ...] = ()


# --- costs, as the seed measures them ------------------------------------------------------------


def _static_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """What PopRT's converter hands the tool: symbolic dims fixed to 1 and value_info inferred."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.dim_value = 1
    return onnx.shape_inference.infer_shapes(fixed)


def _shapes(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    shapes = {init.name: np.array(init.dims, dtype=np.int64) for init in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        shapes[value.name] = np.array(
            [d.dim_value for d in value.type.tensor_type.shape.dim], dtype=np.int64
        )
    return shapes


class _Costs:
    """Per-node weight bytes and FLOPs the seed's way (weights per consuming node, no dedup)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        from poprt.profile import Profiler  # the backend's own FLOP counter, as the seed uses

        inits = {
            init.name: int(np.prod(init.dims, dtype=np.int64))
            * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
            for init in graph.initializer
        }
        shapes = _shapes(graph)
        unknown = np.zeros(0, dtype=np.int64)
        profiler = Profiler()
        self.bytes: dict[str, float] = {}
        self.flops: dict[str, float] = {}
        for node in graph.node:
            skip = node.op_type in SKIPPED_OPS
            self.bytes[node.name] = 0.0 if skip else float(sum(inits.get(i, 0) for i in node.input))
            counter = profiler.get_profiler(node.op_type)
            self.flops[node.name] = float(
                counter(
                    node,
                    [shapes.get(i, unknown) for i in node.input],
                    [shapes.get(o, unknown) for o in node.output],
                )
            )
        self.initializers = frozenset(inits)

    def of(self, names: Iterable[str]) -> tuple[float, float]:
        names = list(names)
        return sum(self.bytes[n] for n in names), sum(self.flops[n] for n in names)


# --- blocks and the first split ------------------------------------------------------------------


def _earlier_producers(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """For each node, the earlier nodes in file order whose outputs it reads (the seed's map)."""
    made_by: dict[str, str] = {}
    found: dict[str, list[str]] = {}
    for node in graph.node:
        found[node.name] = list(dict.fromkeys(made_by[i] for i in node.input if i in made_by))
        for out in node.output:
            made_by.setdefault(out, node.name)  # only earlier nodes are in the map yet
    return found


def build_blocks(graph: onnx.GraphProto, costs: _Costs) -> tuple[Block, ...]:
    """The seed's subgraphs, in the order its greedy split walks them."""
    producers = _earlier_producers(graph)
    names = [n.name for n in graph.node]
    candidates = [
        n.name for n in graph.node if sum(1 for i in n.input if i not in costs.initializers) > 1
    ] or names
    avg_bytes = sum(costs.bytes.values()) / len(candidates)
    avg_flops = sum(costs.flops.values()) / len(candidates)

    visited: set[str] = set()
    raw: list[dict[str, Any]] = []
    for start in candidates:
        if start in visited:
            continue
        members: list[str] = []
        queue = deque([start])
        while queue:
            name = queue.popleft()
            if name in visited:
                continue
            visited.add(name)
            members.append(name)
            queue.extend(p for p in producers[name] if p not in visited)
        weight, flops = costs.of(members)
        if weight < avg_bytes or flops < avg_flops:
            visited.difference_update(members)  # too light: its nodes join a later block
            continue
        raw.append(_raw_block(len(raw), start, members, weight, flops, raw, producers, link=True))
    rest = [n for n in names if n not in visited]
    if rest:
        weight, flops = costs.of(rest)
        # The seed links the left-over block to its parents only: no kids, nothing "included".
        raw.append(_raw_block(len(raw), LEFTOVER, rest, weight, flops, raw, producers, link=False))

    for a in raw:
        for b in raw:
            if a["id"] != b["id"] and a["id"] not in b["included"] and b["id"] not in a["included"]:
                a["parallel"].add(b["id"])
    return tuple(
        Block(
            id=r["id"],
            start=r["start"],
            nodes=tuple(r["nodes"]),
            weight_bytes=r["weight"],
            flops=r["flops"],
            parents=frozenset(r["parents"]),
            kids=frozenset(r["kids"]),
            included=frozenset(r["included"]),
            parallel=frozenset(r["parallel"]),
        )
        for r in raw
    )


def _raw_block(
    index: int,
    start: str,
    members: list[str],
    weight: float,
    flops: float,
    earlier: list[dict[str, Any]],
    producers: Mapping[str, list[str]],
    *,
    link: bool,
) -> dict[str, Any]:
    fed_by = {p for m in members for p in producers[m]}
    block: dict[str, Any] = {
        "id": index,
        "start": start,
        "nodes": members,
        "weight": weight,
        "flops": flops,
        "parents": set(),
        "kids": set(),
        "included": set(),
        "parallel": set(),
    }
    for other in earlier:
        if other["start"] in fed_by:
            block["parents"].add(other["id"])
            if link:
                other["kids"].add(index)
                block["included"].add(other["id"])
    return block


def _add(group: Group, block: Block, blocks: Sequence[Block]) -> Group:
    starts = list(group.starts)
    if not group.last:
        is_start = True
        i = 0
        while i < len(starts):
            if starts[i] in block.included:
                del starts[i]  # the new block reaches this start: it takes over
            elif block.id in blocks[starts[i]].included:
                is_start = False
                break
            else:
                i += 1
        if is_start:
            starts.append(block.id)
    return replace(
        group,
        blocks=(*group.blocks, block.id),
        starts=tuple(starts),
        weight_bytes=group.weight_bytes + block.weight_bytes,
        flops=group.flops + block.flops,
    )


def _remove(group: Group, block: Block, blocks: Sequence[Block]) -> Group:
    starts = list(group.starts)
    if not group.last:
        if block.id in starts:
            starts.remove(block.id)
        for parent in sorted(block.parents):
            if parent in group.blocks and not any(parent in blocks[s].included for s in starts):
                starts.append(parent)
    kept = list(group.blocks)
    kept.remove(block.id)
    return replace(
        group,
        blocks=tuple(kept),
        starts=tuple(starts),
        weight_bytes=group.weight_bytes - block.weight_bytes,
        flops=group.flops - block.flops,
    )


def first_split(blocks: Sequence[Block], num_ipus: int) -> Split:
    """Cut whenever cumulative weight bytes reach total / num_ipus; may yield fewer groups."""
    share = sum(b.weight_bytes for b in blocks) / num_ipus
    cuts: list[int] = []
    running = 0.0
    for index, block in enumerate(blocks):
        if running + block.weight_bytes >= share:
            running = 0.0  # the seed drops the crossing block's bytes from the next group's sum
            cuts.append(index)
            if len(cuts) == num_ipus - 1:
                break
        else:
            running += block.weight_bytes
    groups: list[Group] = []
    begin = 0
    for cut in cuts:
        group = Group()
        for block in blocks[begin : cut + 1]:
            group = _add(group, block, blocks)
        groups.append(group)
        begin = cut + 1
    last = Group(last=True)
    for block in blocks[begin:]:
        last = _add(last, block, blocks)
    return (*groups, last)


# --- moves after an OOM --------------------------------------------------------------------------


def _lightest(split: Split, candidates: Iterable[int], holds: Any) -> int | None:
    """The group with the fewest weight bytes among ``candidates`` holding a matching block."""
    best: int | None = None
    for j in candidates:
        if any(holds(b) for b in split[j].blocks) and (
            best is None or split[j].weight_bytes < split[best].weight_bytes
        ):
            best = j
    return best


def _move(split: Split, source: int, target: int, block: Block, blocks: Sequence[Block]) -> Split:
    groups = list(split)
    groups[source] = _remove(groups[source], block, blocks)
    groups[target] = _add(groups[target], block, blocks)
    return tuple(groups)


def moves(split: Split, device: int, blocks: Sequence[Block]) -> list[Split]:
    """Splits one block away from ``device``: its sharding-point blocks to a later or "parallel"
    group, its top blocks (no parent on the device) to an earlier or "parallel" group."""
    if not 0 <= device < len(split):
        return []  # an IPU the seed left empty; the seed itself would index out of range here
    found: list[Split] = []
    others = [j for j in range(len(split)) if j != device]
    if device < len(split) - 1:
        for b in split[device].starts:
            block = blocks[b]
            later = _lightest(
                split, range(device + 1, len(split)), lambda x, b=b: b in blocks[x].parents
            )
            if later is not None:
                found.append(_move(split, device, later, block, blocks))
            side = _lightest(split, others, lambda x, b=b: b in blocks[x].parallel)
            if side is not None:
                found.append(_move(split, device, side, block, blocks))
    if device > 0:
        here = set(split[device].blocks)
        tops = [b for b in split[device].blocks if not blocks[b].parents & here]
        for b in tops:
            block = blocks[b]
            earlier = _lightest(split, range(device), lambda x, b=b: b in blocks[x].kids)
            if earlier is not None:
                found.append(_move(split, device, earlier, block, blocks))
            side = _lightest(split, others, lambda x, b=b: b in blocks[x].parallel)
            if side is not None:
                found.append(_move(split, device, side, block, blocks))
    return found


def _key(split: Split) -> tuple[frozenset[int], ...]:
    """The seed recognises a split by its groups' sharding points only."""
    return tuple(frozenset(g.starts) for g in split)


def sharding_info(split: Split, blocks: Sequence[Block]) -> dict[str, int]:
    return {
        blocks[s].start: ipu
        for ipu, group in enumerate(split)
        for s in group.starts
        if blocks[s].start != LEFTOVER
    }


# --- compiling ------------------------------------------------------------------------------------


def _compile(
    model: onnx.ModelProto,
    split: Split,
    blocks: Sequence[Block],
    num_ipus: int,
    tiles: int,
    workdir: Path,
    index: int,
    amp: float | None,
) -> tuple[CompileResult, onnx.ModelProto]:
    from poprt import runtime
    from poprt.compiler import Compiler, CompilerOptions
    from poprt.converter import Sharder

    sharded = Sharder(sharding_info(split, blocks)).run(model)
    options = CompilerOptions()
    options.ipu_version = runtime.DeviceManager().ipu_hardware_version()
    options.num_ipus = num_ipus
    options.virtual_graph_mode = "manual"
    if amp is not None:
        options.available_memory_proportion = amp
    outputs = [o.name for o in sharded.graph.output]
    began = time.perf_counter()
    try:
        Compiler.compile_and_export(sharded, outputs, str(workdir / f"seed_{index}.popef"), options)
    except RuntimeError as exc:
        seconds = time.perf_counter() - began
        match = _OOM_TEXT.search(str(exc))
        if match is None:
            return CompileResult(amp, False, None, None, None, str(exc)[:500], seconds), sharded
        tile, used = int(match.group(1)), int(match.group(2))
        return CompileResult(amp, False, tile, tile // tiles, used, None, seconds), sharded
    return CompileResult(amp, True, None, None, None, None, time.perf_counter() - began), sharded


def _ipus(model: onnx.ModelProto) -> dict[str, int]:
    found = {}
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.name == IPU_ATTR:
                found[node.name] = int(helper.get_attribute_value(attribute))
    return found


def search(
    model: onnx.ModelProto, num_ipus: int, *, tiles: int, max_compiles: int = 30, workdir: Path
) -> SeedResult:
    """Run the seed's search to its first compilable split, or give up as it does.

    The search proper stops ``len(AMP_FALLBACKS)`` compiles short of ``max_compiles`` so the AMP
    retries always fit in the budget.
    """
    if num_ipus < 2:
        raise ValueError("the seed needs at least 2 IPUs")
    names = [n.name for n in model.graph.node]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError("the seed needs unique, non-empty node names")
    model = _static_shapes(model)
    costs = _Costs(model.graph)
    blocks = build_blocks(model.graph, costs)
    split = first_split(blocks, num_ipus)

    compiles: list[CompileResult] = []
    queue: deque[Split] = deque([split])
    tried = {_key(split)}
    best_used = 0
    best: Split | None = None
    budget = max_compiles - len(AMP_FALLBACKS)
    while queue and len(compiles) < budget:
        current = queue.popleft()
        result, sharded = _compile(
            model, current, blocks, num_ipus, tiles, workdir, len(compiles), None
        )
        compiles.append(result)
        if result.ok:
            return SeedResult("compiled", tuple(compiles), current, _ipus(sharded), blocks)
        if result.bytes_used is None or result.device is None:
            continue  # the seed's worker dies on such an error; the split is simply lost
        used = result.bytes_used
        if best_used < NEAR_LIMIT_BYTES or best_used >= used:
            for variant in moves(current, result.device, blocks):
                if _key(variant) not in tried:
                    tried.add(_key(variant))
                    queue.append(variant)
        if best_used == 0 or best_used >= used:
            best_used, best = used, current
    if best is None:
        return SeedResult("gave_up", tuple(compiles), None, {}, blocks)
    for amp in AMP_FALLBACKS:
        result, sharded = _compile(
            model, best, blocks, num_ipus, tiles, workdir, len(compiles), amp
        )
        compiles.append(result)
        if result.ok:
            return SeedResult("compiled", tuple(compiles), best, _ipus(sharded), blocks)
    return SeedResult("gave_up", tuple(compiles), best, {}, blocks)


def result_json(result: SeedResult, wall_s: float) -> dict[str, Any]:
    split = result.split or ()
    return {
        "status": result.status,
        "compiles": [
            {
                "amp": c.amp,
                "ok": c.ok,
                "tile": c.tile,
                "device": c.device,
                "bytes_used": c.bytes_used,
                "error": c.error,
                "seconds": c.seconds,
            }
            for c in result.compiles
        ],
        "blocks": len(result.blocks),
        "groups": [
            {"blocks": len(g.blocks), "weight_bytes": g.weight_bytes, "flops": g.flops}
            for g in split
        ],
        "assignment": dict(result.assignment),
        "wall_s": wall_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--num-ipus", type=int, required=True)
    parser.add_argument("--tiles", type=int, default=1472, help="tiles per IPU of the target")
    parser.add_argument("--max-compiles", type=int, default=30)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    model = onnx.load(args.model)
    with tempfile.TemporaryDirectory(prefix="seed-search-") as tmp:
        result = search(
            model,
            args.num_ipus,
            tiles=args.tiles,
            max_compiles=args.max_compiles,
            workdir=Path(tmp),
        )
    json.dump(result_json(result, time.perf_counter() - began), sys.stdout)
    sys.stdout.write("\n")
    return 0 if result.status == "compiled" else 3


if __name__ == "__main__":
    raise SystemExit(main())
