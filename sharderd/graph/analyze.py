"""From a loaded model to everything the planner needs: validated names, dataflow, shapes, costs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from sharderd.config import PlanConfig
from sharderd.errors import DimsUnresolvedError, ModelInvalidError
from sharderd.graph.buffers import alias_sources, node_new_bytes
from sharderd.graph.costs import GraphCosts, compute_costs
from sharderd.graph.dataflow import Dataflow, build_dataflow
from sharderd.graph.folding import fold_constants
from sharderd.graph.load import LoadedModel
from sharderd.graph.names import assign_unique_names, find_name_problems
from sharderd.graph.precision import at_precision, model_precision
from sharderd.graph.shapes import ShapeInfo, UnresolvedDim, shape_info

__all__ = ["MIN_OPSET", "Analysis", "analyze", "check_opsets", "unresolved_dims_error"]

MIN_OPSET = 7
"""Older default-domain opsets predate the ops PopRT and onnxruntime convert reliably."""

_KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.graphcore", "com.graphcore"}


@dataclass(frozen=True, slots=True)
class Analysis:
    loaded: LoadedModel
    flow: Dataflow
    costs: GraphCosts
    shapes: ShapeInfo
    renamed_nodes: int
    """Nodes given a ``<OpType>_<k>`` name because of ``name_nodes``."""
    warnings: tuple[str, ...]
    config: PlanConfig
    precision: str
    """What the costs are at: ``fp32`` or ``fp16`` (``plan.precision``, or the model's own)."""
    source_precision: str
    """The precision of the file itself."""
    folded_nodes: int = 0
    """Nodes the compiler folds into constants (costed as weights of their readers, no time)."""
    folded_bytes: int = 0
    folded: np.ndarray | None = None
    """bool [N]: the nodes folded into constants (None: none)."""
    alias_source: np.ndarray | None = None
    """int64 [T]: the input whose memory each tensor takes over (a view, an in-place op), or -1
    (``graph/buffers.py``; None: every tensor has memory of its own)."""
    priced: bool = False
    """The analysis of a rewrite into pieces that was priced, not written
    (``shard.serialize_price``): its model has no weight values, so it is planned, never written."""

    @property
    def model(self) -> onnx.ModelProto:
        return self.loaded.model

    @property
    def compiled(self) -> np.ndarray:
        """bool [N]: the nodes the compiler keeps (not folded into constants)."""
        if self.folded is None:
            return np.ones(self.flow.num_nodes, dtype=bool)
        return ~self.folded

    def node_new_bytes(self) -> np.ndarray:
        """int64 [N]: activation memory each node's outputs add (0 for a view or an in-place op)."""
        return node_new_bytes(self.flow, self.costs.tensor_bytes, self.alias_source)

    @property
    def compiled_ops(self) -> int:
        return int(self.compiled.sum())

    @property
    def total_flops(self) -> float:
        return float(self.costs.flops.sum())

    @property
    def total_weight_bytes(self) -> int:
        """Distinct weights some node needs (folded constants included, their sources not)."""
        return int(self.flow.weight_bytes[np.unique(self.flow.nw_idx)].sum())


def check_opsets(model: onnx.ModelProto) -> list[str]:
    """Refuse opsets nobody can compile; return warnings for domains the cost table does not know."""
    warnings = []
    max_opset = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            if opset.version < MIN_OPSET or opset.version > max_opset:
                raise ModelInvalidError(
                    f"unsupported default-domain opset {opset.version}: sharderd supports {MIN_OPSET}..{max_opset}",
                    hint="convert the model with onnx.version_converter.convert_version",
                )
        elif opset.domain not in _KNOWN_DOMAINS:
            warnings.append(
                f"custom domain {opset.domain!r} (opset {opset.version}): its ops get the default cost"
            )
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        raise _no_default_domain(model)
    return warnings


def _no_default_domain(model: onnx.ModelProto) -> ModelInvalidError:
    """Why a graph with no ``ai.onnx`` ops cannot be sharded, naming what it is instead."""
    domains = sorted({o.domain for o in model.opset_import})
    ops = sorted({n.op_type for n in model.graph.node})
    what = f"it imports only {', '.join(repr(d) for d in domains) or 'no opsets'}"
    if ops:
        what += f" (ops: {', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''})"
    message = (
        f"the model imports no default-domain opset: {what}. sharderd splits neural-network graphs of "
        "default-domain (ai.onnx) ops into pipeline stages, one accelerator each, and has a cost model "
        "for those ops only"
    )
    hint = None
    if "ai.onnx.ml" in domains:
        hint = (
            "ai.onnx.ml models (linear classifiers, tree ensembles, encoders) are not sharded; onnxruntime "
            "runs them as they are, on the CPU."
        )
    return ModelInvalidError(message, hint=hint)


def analyze(loaded: LoadedModel, config: PlanConfig) -> Analysis:
    """Validate and cost ``loaded``. With ``config.name_nodes`` unnamed/duplicate nodes are renamed
    in ``loaded.model`` (the report says how many); otherwise they are an error listing them."""
    graph = loaded.model.graph
    warnings = check_opsets(loaded.model)
    problems = find_name_problems(graph)
    renamed = 0
    if problems:
        if not config.name_nodes:
            raise ModelInvalidError(
                f"every node needs a unique, non-empty name (PopRT addresses nodes by name): {problems.describe(graph)}",
                hint="rerun with --name-nodes to name them <OpType>_<k> (or set plan.name_nodes = true)",
                reruns=({"name_nodes": True},),
            )
        renamed = assign_unique_names(graph)
        warnings.append(f"renamed {renamed} unnamed or duplicate node(s) to <OpType>_<k>")
    flow = build_dataflow(graph)
    shapes = shape_info(
        loaded.model,
        batch_size=config.batch_size,
        dims=config.dims,
        input_shapes=config.input_shapes,
        order=flow.topo_order.tolist(),
    )
    if shapes.unresolved:
        raise unresolved_dims_error(shapes.unresolved)
    costs = compute_costs(graph, flow, shapes.types)
    folding = fold_constants(graph, flow, costs, shapes.types)
    source_precision = model_precision(flow)
    precision = source_precision if config.precision == "model" else config.precision
    flow, costs = at_precision(folding.flow, folding.costs, shapes.types, precision)
    for shape in shapes.data_dependent[:5]:
        warnings.append(
            f"{shape.tensor!r} from {shape.op_type} node {shape.node!r} has a data-dependent size: {shape.costed_as}"
        )
    if len(shapes.data_dependent) > 5:
        warnings.append(
            f"{len(shapes.data_dependent) - 5} more data-dependent tensor(s), costed the same way"
        )
    for note in shapes.notes[:5]:
        warnings.append(f"shape inference: {note}")
    if len(shapes.notes) > 5:
        warnings.append(f"shape inference: {len(shapes.notes) - 5} more note(s)")
    if shapes.inference_error:
        warnings.append(f"{shapes.inference_error}; fell back to ONNX shape inference")
    if costs.unknown_tensors:
        shown = ", ".join(costs.unknown_tensors[:5])
        warnings.append(
            f"{len(costs.unknown_tensors)} activation tensor(s) of unknown size count as 0 bytes: {shown}"
        )
        for stop in shapes.stops[:5]:
            warnings.append(
                f"sizes stop being known at {stop.op_type} node {stop.node!r}: {stop.why}"
            )
        if len(shapes.stops) > 5:
            warnings.append(f"{len(shapes.stops) - 5} more node(s) where sizes stop being known")
    if costs.default_cost_ops:
        shown = ", ".join(f"{op} ×{n}" for op, n in sorted(costs.default_cost_ops.items()))
        warnings.append(f"ops costed with the default rule (1 FLOP per output element): {shown}")
    warnings.extend(costs.control_flow_notes)
    if not np.isfinite(costs.flops).all():
        raise ModelInvalidError("FLOP count overflowed: the model declares absurd dims")
    return Analysis(
        loaded,
        flow,
        costs,
        shapes,
        renamed,
        tuple(warnings),
        config,
        precision,
        source_precision,
        folding.folded_nodes,
        folding.folded_bytes,
        folding.folded,
        alias_sources(graph, flow, costs.tensor_bytes, ~folding.folded),
    )


def unresolved_dims_error(dims: tuple[UnresolvedDim, ...]) -> DimsUnresolvedError:
    """Name every open dim, and the exact flag, config line and sidecar line that would set each."""
    listed = "\n".join(f"  {d.describe()}" for d in dims)
    named = list(dict.fromkeys(d.name for d in dims if d.name))
    anonymous = {d.input: d.template or "<d0>,<d1>,..." for d in dims if not d.name}
    flags = [f"--dim {name}=<size>" for name in named]
    flags += [f"--input-shape {name}={template}" for name, template in anonymous.items()]
    tables = []
    if named:
        tables.append("dims = { " + ", ".join(f"{name} = <size>" for name in named) + " }")
    if anonymous:
        shapes = ", ".join(f"{name} = [{t.replace(',', ', ')}]" for name, t in anonymous.items())
        tables.append("input_shapes = { " + shapes + " }")
    hint = (
        "give each a value (replace <size> with the size to compile for):\n"
        f"  on the command line:            {' '.join(flags)}\n"
        f"  in sharderd.toml under [plan]:  {'; '.join(tables)}\n"
        f"  in a daemon job's sidecar (<model>.toml beside it): {'; '.join(tables)}"
    )
    return DimsUnresolvedError(
        f"{len(dims)} symbolic input dim(s) have no value; the IPU compiles static shapes and sharderd "
        f"never plans on guessed sizes:\n{listed}",
        hint=hint,
        dims=tuple((d.input, d.axis, d.name) for d in dims),
        templates=anonymous,
    )
