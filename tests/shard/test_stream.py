"""Writing weights from where they lie: inline again (byte for byte), converted to fp16 on the way,
into one data file past protobuf's limit, or reached through a link by a compile attempt."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from sharderd.backends.ort_sessions import OrtSession, session_options
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file, make_plan, write_shard_files
from sharderd.errors import SharderdError
from sharderd.graph.in_file import in_file_tensors
from sharderd.graph.load import load_model
from sharderd.graph.weights import read_model_proto
from sharderd.shard import write
from sharderd.shard.convert import to_fp16
from sharderd.shard.write import link_in_file, write_converted, write_model
from sharderd.target import BUILTIN_TARGETS

TINY_GPT2 = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_gpt2" / "model.onnx"
SHAPES = {"input_ids": (1, 128), "attention_mask": (1, 128)}


@pytest.fixture
def inline(tmp_path: Path) -> Path:
    """A copy of tiny_gpt2 (weights inline, 11 of them over the threshold) in its own folder."""
    folder = tmp_path / "src"
    folder.mkdir()
    return Path(shutil.copy(TINY_GPT2, folder / "gpt.onnx"))


def _external(tmp_path: Path) -> Path:
    """tiny_gpt2 with its tensors over 4096 bytes in ``gpt.data`` (onnx measures a tensor as its
    bytes plus 33): the set the engine treats as weights either way, so only where they lie differs."""
    folder = tmp_path / "ext"
    folder.mkdir()
    path = folder / "gpt.onnx"
    onnx.save(
        onnx.load(str(TINY_GPT2)),
        str(path),
        save_as_external_data=True,
        location="gpt.data",
        size_threshold=4096 + 34,
    )
    return path


def _fp16_bytes(model: onnx.ModelProto, base: Path, out: Path) -> list[bytes]:
    converted, _ = to_fp16(model, base)
    data = write_converted(converted, out)
    return [out.read_bytes(), *(d.read_bytes() for d in data)]


def test_fp16_streamed_is_the_conversion_of_the_whole_model(inline: Path, tmp_path: Path) -> None:
    """Converted while streamed from the file, the weights are what onnxruntime's converter makes
    of them in memory, to the byte."""
    streamed = _fp16_bytes(load_model(inline).model, inline.parent, tmp_path / "a.onnx")
    whole = _fp16_bytes(onnx.load(str(inline)), inline.parent, tmp_path / "b.onnx")
    assert len(streamed) == 1 and streamed == whole
    written = onnx.load(str(tmp_path / "a.onnx"))
    assert sum(t.data_type == onnx.TensorProto.FLOAT16 for t in written.graph.initializer) >= 11


def test_fp16_of_external_data_is_written_inline_as_onnx_loads_it(tmp_path: Path) -> None:
    """External weights converted to fp16 land inline, as when onnx reads them in first (which
    writes their data_location as DEFAULT)."""
    path = _external(tmp_path)
    streamed = _fp16_bytes(load_model(path).model, path.parent, tmp_path / "a.onnx")
    whole = _fp16_bytes(onnx.load(str(path)), path.parent, tmp_path / "b.onnx")
    assert streamed == whole


def test_fp16_past_the_protobuf_limit_goes_to_one_data_file_as_onnx_lays_it_out(
    inline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the inline limit (lowered here to 0), the streamed model and data file are those
    ``onnx.save_model(save_as_external_data=True)`` writes for the converted model in memory."""
    monkeypatch.setattr(write, "_INLINE_LIMIT", 0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    streamed = _fp16_bytes(load_model(inline).model, inline.parent, tmp_path / "a" / "m.onnx")
    whole = _fp16_bytes(onnx.load(str(inline)), inline.parent, tmp_path / "b" / "m.onnx")
    assert len(streamed) == 2 and streamed == whole


def _planned(path: Path) -> tuple[PlanConfig, object]:
    config = PlanConfig(input_shapes=SHAPES)
    analysis = analyze_file(path, config)
    return config, (analysis, make_plan(analysis, BUILTIN_TARGETS["ipu-mk2"], 2, config))


def _run(model: onnx.ModelProto, base: Path) -> np.ndarray:
    feeds = {
        "input_ids": np.arange(128, dtype=np.int64).reshape(1, 128) % 1000,
        "attention_mask": np.ones((1, 128), dtype=np.int64),
    }
    so = session_options(ort, optimization="basic")
    session = OrtSession.build(ort, model, base, so, ["CPUExecutionProvider"])
    return session.run(["logits"], feeds)[0]


def test_a_compile_attempt_reads_inline_weights_through_a_link(
    inline: Path, tmp_path: Path
) -> None:
    """An attempt's model refers to the user's file through a link beside it (no copy of the
    weights), and runs as the original does; the kept output holds them inline."""
    _, (analysis, plan) = _planned(inline)
    attempt = write_shard_files(analysis, plan, tmp_path / "attempt", "gpt", link_external=True)
    link = tmp_path / "attempt" / "gpt.onnx"
    assert attempt.external == (link,) and link.samefile(inline)
    assert attempt.model.stat().st_size < inline.stat().st_size / 5
    written = read_model_proto(attempt.model)
    locations = {
        e.value for t in written.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {"gpt.onnx"}
    expected = _run(onnx.load(str(inline)), inline.parent)
    assert np.allclose(_run(written, attempt.model.parent), expected, rtol=1e-5, atol=1e-6)

    kept = write_shard_files(analysis, plan, tmp_path / "kept", "gpt")
    assert kept.external == () and not (tmp_path / "kept" / "gpt.onnx").exists()
    model = onnx.load(str(kept.model))
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert kept.model.stat().st_size > inline.stat().st_size * 0.9


def test_a_link_never_takes_the_name_of_an_attempts_own_file(inline: Path, tmp_path: Path) -> None:
    model = load_model(inline).model
    made = link_in_file(model, tmp_path, {"gpt.onnx"})
    assert made == [tmp_path / "inline-gpt.onnx"] and made[0].samefile(inline)
    assert not list(in_file_tensors(model))


def test_without_the_kernels_copy_the_bytes_are_the_same(
    inline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across filesystems ``copy_file_range`` fails; the bounded read/write path writes the same."""
    model = load_model(inline).model

    def refuse(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    write_model(model, tmp_path / "kernel.onnx")
    monkeypatch.setattr(os, "copy_file_range", refuse)
    write_model(model, tmp_path / "python.onnx")
    expected = TINY_GPT2.read_bytes()
    assert (tmp_path / "kernel.onnx").read_bytes() == expected
    assert (tmp_path / "python.onnx").read_bytes() == expected


def test_a_source_cut_after_loading_is_an_error_and_leaves_nothing(
    inline: Path, tmp_path: Path
) -> None:
    model = load_model(inline).model
    os.truncate(inline, inline.stat().st_size // 2)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SharderdError, match="changed while it was read"):
        write_model(model, out / "m.onnx")
    assert list(out.iterdir()) == []
