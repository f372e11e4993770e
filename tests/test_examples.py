"""The example-model builders produce valid, runnable, deterministic models with their quirks intact."""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from sharderd import examples
from sharderd.errors import ConfigError

BATCH = 3
"""Value fed for a symbolic batch dim."""

SMALL: dict[str, Callable[..., onnx.ModelProto]] = {
    "transformer": functools.partial(
        examples.transformer, layers=2, hidden=32, heads=4, seq=8, vocab=50
    ),
    "transformer_tied": functools.partial(
        examples.transformer, layers=2, hidden=32, heads=4, seq=8, vocab=50, tied_embeddings=True
    ),
    "cnn": functools.partial(examples.cnn, blocks=4, channels=8, image=32, batch=2),
    "shared_weights": functools.partial(examples.shared_weights, layers=5, hidden=16),
    "with_if": functools.partial(examples.with_if, hidden=16),
    "multi_io": functools.partial(examples.multi_io, hidden=16),
    "chain": functools.partial(examples.chain, nodes=23, hidden=16),
}


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, those inside subgraphs included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
            for sub in subgraphs:
                yield from _nodes(sub)


def _consumers(graph: onnx.GraphProto, tensor: str) -> list[onnx.NodeProto]:
    return [node for node in graph.node if tensor in node.input]


def _dims(info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for info in model.graph.input:
        shape = [BATCH if isinstance(d, str) else d for d in _dims(info)]
        elem = info.type.tensor_type.elem_type
        if info.name == "attention_mask":
            mask = np.ones(shape, dtype=np.int64)
            mask[:, -2:] = 0
            feeds[info.name] = mask
        elif elem == onnx.TensorProto.INT64:
            feeds[info.name] = rng.integers(0, 50, shape, dtype=np.int64)
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _run(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = os.fspath(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    outputs: list[np.ndarray] = session.run(None, feeds)
    return outputs


def _weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    (tensor,) = (t for t in model.graph.initializer if t.name == name)
    return numpy_helper.to_array(tensor)


@pytest.mark.parametrize("name", SMALL)
def test_builders_pass_the_full_checker_and_strict_shape_inference(name: str) -> None:
    """Every model is valid ONNX at opset 17 / IR 8 and every intermediate gets a complete shape."""
    model = SMALL[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    inferred = onnx.shape_inference.infer_shapes(
        model, check_type=True, strict_mode=True, data_prop=True
    )
    produced = {out for node in model.graph.node for out in node.output}
    graph_outputs = {o.name for o in model.graph.output}
    shaped = {v.name: v for v in inferred.graph.value_info}
    assert produced - graph_outputs == set(shaped)
    for info in shaped.values():
        dims = info.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") or d.HasField("dim_param") for d in dims), info


@pytest.mark.parametrize("name", SMALL)
def test_nodes_have_unique_readable_names_or_none_when_asked(name: str) -> None:
    """Node names are unique path-like names, or all empty with name_nodes=False."""
    named = [n.name for n in _nodes(SMALL[name]().graph)]
    assert all(n.startswith("/") for n in named)
    assert len(set(named)) == len(named)
    unnamed = SMALL[name](name_nodes=False)
    onnx.checker.check_model(unnamed, full_check=True)
    assert [n.name for n in _nodes(unnamed.graph)] == [""] * len(named)


@pytest.mark.parametrize("name", SMALL)
def test_models_run_in_onnxruntime_with_finite_outputs_of_the_declared_shapes(name: str) -> None:
    """onnxruntime runs each model and returns finite, non-constant outputs shaped as declared."""
    model = SMALL[name]()
    outputs = _run(model, _feeds(model))
    assert len(outputs) == len(model.graph.output)
    for info, value in zip(model.graph.output, outputs, strict=True):
        assert list(value.shape) == [BATCH if isinstance(d, str) else d for d in _dims(info)]
        assert np.isfinite(value).all()
        assert value.std() > 1e-4


@pytest.mark.parametrize("name", SMALL)
def test_same_seed_gives_identical_bytes_and_another_seed_other_weights(name: str) -> None:
    """Builds are deterministic for a seed; a different seed changes the weights, not the graph."""
    first, again, other = SMALL[name](), SMALL[name](), SMALL[name](seed=1)
    assert first.SerializeToString() == again.SerializeToString()
    assert first.SerializeToString() != other.SerializeToString()
    assert [n.name for n in first.graph.node] == [n.name for n in other.graph.node]


def test_transformer_reads_the_mask_input_in_every_layer() -> None:
    """attention_mask feeds one node per layer, and each layer has the BERT op sequence."""
    model = examples.transformer(layers=3, hidden=32, heads=4, seq=8, vocab=50)
    readers = _consumers(model.graph, "attention_mask")
    assert [n.name for n in readers] == [f"/layer{i}/attn/mask/Cast" for i in range(3)]
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Softmax"] == ops["Erf"] == 3
    assert ops["LayerNormalization"] == 1 + 2 * 3
    assert ops["MatMul"] == 3 * (4 + 2 + 2) + 1
    names = {n.name for n in model.graph.node}
    assert {"/layer2/attn/MatMul_qk", "/layer2/attn/Softmax", "/lm_head/MatMul"} <= names
    assert _dims(model.graph.input[0]) == ["batch", 8]
    assert _dims(model.graph.output[0]) == ["batch", 8, 50]


def test_transformer_masked_tokens_do_not_reach_unmasked_positions() -> None:
    """Changing tokens under a zero mask leaves every unmasked position's logits unchanged."""
    model = examples.transformer(layers=3, hidden=32, heads=4, seq=8, vocab=50, batch=1)
    feeds = _feeds(model)
    changed = dict(feeds, input_ids=feeds["input_ids"].copy())
    changed["input_ids"][:, -2:] = (feeds["input_ids"][:, -2:] + 7) % 50
    (base,), (other,) = _run(model, feeds), _run(model, changed)
    np.testing.assert_allclose(base[:, :-2], other[:, :-2], rtol=0, atol=1e-6)
    assert not np.allclose(base[:, -2:], other[:, -2:])


def test_tied_embeddings_share_one_initializer_between_two_distant_nodes() -> None:
    """With tied embeddings the head transposes the token table; untied, no float weight is shared."""
    tied = examples.transformer(layers=2, hidden=32, heads=4, seq=8, vocab=50, tied_embeddings=True)
    table = "embeddings.word_embeddings.weight"
    readers = _consumers(tied.graph, table)
    assert [n.name for n in readers] == ["/embeddings/Gather", "/lm_head/Transpose"]
    index = {n.name: i for i, n in enumerate(tied.graph.node)}
    assert index["/lm_head/Transpose"] - index["/embeddings/Gather"] > 50
    assert "lm_head.weight" not in {t.name for t in tied.graph.initializer}

    untied = examples.transformer(layers=2, hidden=32, heads=4, seq=8, vocab=50)
    uses = Counter(i for n in untied.graph.node for i in n.input)
    floats = [t.name for t in untied.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert max(uses[name] for name in floats) == 1


def test_transformer_static_batch_and_bad_heads() -> None:
    """An integer batch makes the inputs static; hidden not divisible by heads is a ConfigError."""
    model = examples.transformer(layers=1, hidden=32, heads=4, seq=8, vocab=50, batch=2)
    assert _dims(model.graph.input[1]) == [2, 8]
    with pytest.raises(ConfigError, match="hidden must be divisible by heads"):
        examples.transformer(hidden=30, heads=4)


def test_cnn_downsamples_every_second_block_with_a_projection() -> None:
    """Odd blocks stride 2 with a 1x1 projection on the skip; the head is a Gemm to the classes."""
    model = examples.cnn(blocks=5, channels=8, image=32, classes=7, batch=2)
    names = {n.name for n in model.graph.node}
    assert {"/block1/downsample/Conv", "/block3/downsample/Conv"} <= names
    assert not any(n.startswith(("/block0/downsample", "/block2/downsample")) for n in names)
    strided = {
        n.name
        for n in model.graph.node
        if n.op_type == "Conv" and any(a.name == "strides" and a.ints[0] == 2 for a in n.attribute)
    }
    assert strided == {
        "/stem/Conv",
        "/block1/conv1/Conv",
        "/block1/downsample/Conv",
        "/block3/conv1/Conv",
        "/block3/downsample/Conv",
    }
    assert _weight(model, "layer.3.downsample.conv.weight").shape == (32, 16, 1, 1)
    (logits,) = _run(model, _feeds(model))
    assert logits.shape == (2, 7)


def test_cnn_channel_growth_is_capped() -> None:
    """Deep CNNs stop doubling channels at 8x the base width."""
    model = examples.cnn(blocks=12, channels=4, image=16)
    assert _weight(model, "fc.weight").shape == (10, 32)


def test_shared_weights_feeds_first_middle_and_last_matmul() -> None:
    """W_shared is read by exactly the first, middle and last MatMuls; other layers own theirs."""
    model = examples.shared_weights(layers=6, hidden=16)
    readers = _consumers(model.graph, "W_shared")
    assert [n.name for n in readers] == ["/layer0/MatMul", "/layer3/MatMul", "/layer5/MatMul"]
    own = {t.name for t in model.graph.initializer if t.name.endswith(".weight")}
    assert own == {"layer1.weight", "layer2.weight", "layer4.weight"}
    with pytest.raises(ConfigError, match="layers"):
        examples.shared_weights(layers=2)


def test_with_if_branches_hold_weights_and_read_an_outer_tensor() -> None:
    """Both branches carry a [h, h] weight and use a top-level tensor they do not declare."""
    model = examples.with_if(hidden=16)
    (if_node,) = (n for n in model.graph.node if n.op_type == "If")
    branches = {a.name: a.g for a in if_node.attribute}
    outer = {out for n in model.graph.node for out in n.output}
    for branch in branches.values():
        local = {out for n in branch.node for out in n.output} | {
            t.name for t in branch.initializer
        }
        implicit = {i for n in branch.node for i in n.input} - local
        assert implicit == {"/pre/MatMul_output_0"}
        assert implicit <= outer
        assert not branch.input
    (constant,) = branches["then_branch"].node[:1]
    assert constant.op_type == "Constant"
    assert list(constant.attribute[0].t.dims) == [16, 16]
    assert [list(t.dims) for t in branches["else_branch"].initializer] == [[16, 16]]
    assert [n.op_type for n in model.graph.node][-3:] == ["MatMul", "Relu", "MatMul"]


def test_with_if_takes_each_branch_by_the_sign_of_the_input() -> None:
    """x and -x take opposite branches, and onnxruntime matches a numpy reference for both."""
    model = examples.with_if(hidden=16)
    (if_node,) = (n for n in model.graph.node if n.op_type == "If")
    branches = {a.name: a.g for a in if_node.attribute}
    then_w = numpy_helper.to_array(branches["then_branch"].node[0].attribute[0].t)
    else_w = numpy_helper.to_array(branches["else_branch"].initializer[0])
    x = _feeds(model)["x"]
    taken = set()
    for sign in (1.0, -1.0):
        xs = (sign * x).astype(np.float32)
        h = xs @ _weight(model, "pre.weight")
        taken.add(bool(h.sum() > 0))
        branch = np.maximum(h @ then_w, 0) if h.sum() > 0 else np.tanh(h @ else_w)
        post = np.maximum(branch @ _weight(model, "post.0.weight"), 0)
        expected = post @ _weight(model, "post.1.weight")
        (y,) = _run(model, {"x": xs})
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert taken == {True, False}


def test_multi_io_reads_b_early_and_late_and_reuses_an_output() -> None:
    """b feeds the first nodes and the last Add; out_sum is both an output and consumed."""
    model = examples.multi_io(hidden=16)
    order = [n.name for n in model.graph.node]
    b_readers = [order.index(n.name) for n in _consumers(model.graph, "b")]
    assert min(b_readers) <= 2
    assert max(b_readers) == len(order) - 2
    assert [n.name for n in _consumers(model.graph, "out_sum")] == ["/deep/MatMul_0"]
    assert [o.name for o in model.graph.output] == ["out_sum", "out_prod", "out_deep"]
    feeds = _feeds(model)
    out_sum, out_prod, _ = _run(model, feeds)
    a_proj = feeds["a"] @ _weight(model, "a.weight")
    b_proj = feeds["b"] @ _weight(model, "b.weight")
    np.testing.assert_allclose(out_sum, a_proj + feeds["b"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_prod, a_proj * b_proj, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nodes", [1, 4, 5, 7, 1000])
def test_chain_has_exactly_the_requested_nodes(nodes: int) -> None:
    """chain(nodes=n) has n nodes, one weight per MatMul, and its last node writes y."""
    model = examples.chain(nodes=nodes, hidden=8)
    assert len(model.graph.node) == nodes
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["MatMul"] == len(model.graph.initializer)
    assert ops["Add"] == nodes // 5
    assert list(model.graph.node[-1].output) == ["y"]
    onnx.checker.check_model(model, full_check=True)


def test_chain_residual_adds_reach_back_to_the_unit_input() -> None:
    """Each Add sums the branch with the tensor that entered its unit four nodes earlier."""
    model = examples.chain(nodes=15, hidden=8)
    outputs = ["x"] + [n.output[0] for n in model.graph.node]
    adds = [k for k, n in enumerate(model.graph.node) if n.op_type == "Add"]
    assert adds == [4, 9, 14]
    for k in adds:
        assert list(model.graph.node[k].input) == [outputs[k], outputs[k - 4]]


def test_chain_of_100k_nodes_builds_fast() -> None:
    """A 100k-node chain builds in linear time, well within a few seconds."""
    start = time.perf_counter()
    model = examples.chain(nodes=100_000, hidden=8)
    elapsed = time.perf_counter() - start
    assert len(model.graph.node) == 100_000
    assert len({n.name for n in model.graph.node}) == 100_000
    assert elapsed < 5.0


def test_deep_chain_stays_finite_and_nontrivial() -> None:
    """A 10k-node chain's output is finite, O(1) and differs from its input."""
    model = examples.chain(nodes=10_000, hidden=16)
    x = _feeds(model)["x"]
    (y,) = _run(model, {"x": x})
    assert np.isfinite(y).all()
    assert 0.1 < np.abs(y - x).max() < 10


def test_save_with_external_data_round_trips_through_onnxruntime(tmp_path: Path) -> None:
    """Saving with external data gives identical outputs and leaves the in-memory model intact."""
    model = examples.transformer(
        layers=2, hidden=32, heads=4, seq=8, vocab=50, tied_embeddings=True
    )
    before = model.SerializeToString()
    path = examples.save(model, tmp_path / "bert.onnx", external_data=True)
    assert path == tmp_path / "bert.onnx"
    assert model.SerializeToString() == before
    data = tmp_path / "bert.data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert.data", "bert.onnx"]

    on_disk = onnx.load(os.fspath(path), load_external_data=False)
    external = {
        t.name for t in on_disk.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
    }
    big = {t.name for t in model.graph.initializer if len(t.raw_data) >= 1024}
    assert external == big
    assert path.stat().st_size < 64 * 1024 < data.stat().st_size

    feeds = _feeds(model)
    for got, want in zip(_run(path, feeds), _run(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)

    size = data.stat().st_size
    examples.save(model, path, external_data=True)
    assert data.stat().st_size == size


def test_save_externalizes_initializers_inside_if_branches(tmp_path: Path) -> None:
    """The else-branch initializer moves to the data file; onnxruntime still runs both branches."""
    model = examples.with_if(hidden=32)
    path = examples.save(model, tmp_path / "if.onnx", external_data=True, size_threshold=256)
    on_disk = onnx.load(os.fspath(path), load_external_data=False)
    (if_node,) = (n for n in on_disk.graph.node if n.op_type == "If")
    branches = {a.name: a.g for a in if_node.attribute}
    assert branches["else_branch"].initializer[0].data_location == onnx.TensorProto.EXTERNAL
    x = _feeds(model)["x"]
    for xs in (x, -x):
        np.testing.assert_array_equal(_run(path, {"x": xs})[0], _run(model, {"x": xs})[0])


def test_save_without_external_data_writes_one_self_contained_file(tmp_path: Path) -> None:
    """A plain save is a single file that loads back equal to the model."""
    model = examples.multi_io(hidden=16)
    path = examples.save(model, tmp_path / "m.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    assert onnx.load(os.fspath(path)).SerializeToString() == model.SerializeToString()


def test_large_external_model_is_sparse_and_loads_without_its_weights(tmp_path: Path) -> None:
    """A 64 MiB model is a tiny .onnx plus a sparse .data that dims, offsets and lengths describe."""
    total = 64 << 20
    path = examples.large_external_model(tmp_path / "big.onnx", total_bytes=total, layers=4)
    data = tmp_path / "big.data"
    onnx.checker.check_model(os.fspath(path))

    model = onnx.load(os.fspath(path), load_external_data=False)
    assert model.ByteSize() < 16 * 1024
    weights = list(model.graph.initializer)
    assert len(weights) == 4
    end = 0
    nbytes = 0
    for tensor in weights:
        assert tensor.data_type == onnx.TensorProto.FLOAT16
        assert tensor.data_location == onnx.TensorProto.EXTERNAL
        assert not tensor.HasField("raw_data")
        info = {e.key: e.value for e in tensor.external_data}
        assert info["location"] == "big.data"
        offset, length = int(info["offset"]), int(info["length"])
        assert length == int(np.prod(tensor.dims)) * 2
        assert offset >= end and offset % 4096 == 0
        end = offset + length
        nbytes += length
    assert nbytes >= total
    stat = data.stat()
    assert stat.st_size == end
    assert stat.st_blocks * 512 < 1 << 20

    h = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    (y,) = _run(path, {"x": np.ones((2, h), dtype=np.float16)})
    assert y.shape == (2, h)
    assert not y.any()


def test_large_external_model_over_2gb_passes_the_path_checker(tmp_path: Path) -> None:
    """A 2.5 GB model is written instantly, sparse, and accepted by the path-based checker."""
    path = examples.large_external_model(tmp_path / "huge.onnx", total_bytes=2_500_000_000)
    onnx.checker.check_model(os.fspath(path))
    data = tmp_path / "huge.data"
    assert data.stat().st_size >= 2_500_000_000
    assert data.stat().st_blocks * 512 < 1 << 20
    assert path.stat().st_size < 16 * 1024


def test_large_external_model_honours_dtype(tmp_path: Path) -> None:
    """dtype sets the weights' and the input's element type and the bytes per weight."""
    path = examples.large_external_model(
        tmp_path / "f32.onnx", total_bytes=1 << 20, layers=2, dtype=np.float32
    )
    model = onnx.load(os.fspath(path), load_external_data=False)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    h = model.graph.initializer[0].dims[0]
    assert 2 * h * h * 4 >= 1 << 20
    (y,) = _run(path, {"x": np.ones((1, h), dtype=np.float32)})
    assert y.shape == (1, h)


@pytest.mark.parametrize(
    ("builder", "option"),
    [
        (functools.partial(examples.chain, nodes=0), "nodes"),
        (functools.partial(examples.cnn, image=-1), "image"),
        (functools.partial(examples.transformer, batch=""), "batch"),
        (functools.partial(examples.multi_io, hidden=0), "hidden"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(
    builder: Callable[[], onnx.ModelProto], option: str
) -> None:
    """Non-positive sizes and empty dim names raise ConfigError naming the option."""
    with pytest.raises(ConfigError, match=f"option {option} "):
        builder()


def test_examples_registry_lists_every_small_builder() -> None:
    """EXAMPLES maps CLI names to the builders, each callable with defaults only."""
    assert set(examples.EXAMPLES) == {
        "transformer",
        "cnn",
        "shared_weights",
        "with_if",
        "multi_io",
        "chain",
        "tiled_tail",
        "wide_head",
    }
    assert examples.EXAMPLES["chain"]().graph.name == "chain"
