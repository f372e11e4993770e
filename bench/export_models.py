"""Regenerate the extra real models in ``tests/data/models/`` and their manifest entries.

Not run by the tests (it needs torch and transformers, which are not project dependencies). The
five original models came from ``../shared/models``; this script adds the architectures issue #10
names that those five do not cover:

- ``tiny_gpt2_kv``: GPT-2 LM head with ``use_cache=True``: every layer's present key/value is a
  graph output (optimum's ``decoder_model.onnx`` layout).
- ``tiny_gpt2_past``: the same with ``past_key_values`` as inputs too (``decoder_with_past``): a
  symbolic ``past_sequence`` and an attention mask of length ``past_sequence + sequence``.
- ``tiny_mobilenet_v2``: MobileNetV2 with TensorFlow-style padding, dynamic height/width, so the
  exporter computes every ``Pad`` from the input size.
- ``ppocr_cls``: PaddleOCR's text-direction classifier as shipped in the ``rapidocr-onnxruntime``
  wheel (paddle2onnx export, anonymous and ``-1`` input dims).
- ``silero_vad``: Silero VAD 16 kHz (opset 15) from the ``silero-vad`` wheel: nested ``If`` bodies
  holding the LSTM.
- ``data_dependent``: built with ``onnx.helper``: ``NonZero`` and a ``TopK`` whose k is computed
  from the data, around a MatMul, so the plan has shapes no input dim fixes.
- ``window_attention``, ``unet_attn64``, ``gpt_decoder``, ``bert_encoder`` (issue #27): pure torch
  modules (``bench/tiny_torch_models.py``, no transformers): Swin-style window attention whose
  ``Pad`` amounts are computed from the input size, a U-Net with self-attention over a 64×64
  latent, a GPT-2-style decoder, BERT. Only torch is needed for these four.
- ``swin_t``, ``swin_v2_t``, ``maxvit_t`` (issue 36): torchvision's own ``SwinTransformer`` and
  ``MaxVit`` classes with the real depths, window/partition sizes and a 224x224 input, at a reduced
  width (embed_dim 16, MaxVit channels 8..64) so each stays a few MB; dynamic height and width, so
  every window pad is computed from the input size as in the full-size exports. Needs torchvision.

torch exports follow ``../shared/models/README.md``: TorchScript exporter (``dynamo=False``), opset
17, eager attention, constant folding on, tiny configs of real architectures built from config
with random weights (``torch.manual_seed(0)``; nothing is downloaded but the two wheels).

    python3 -m venv /tmp/export-venv
    /tmp/export-venv/bin/pip install torch==2.13.0 transformers onnx onnxruntime
    /tmp/export-venv/bin/python bench/export_models.py            # all of them
    /tmp/export-venv/bin/python bench/export_models.py ppocr_cls   # one
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
MANIFEST = MODELS / "manifest.json"
OPSET = 17

RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
SILERO = "silero-vad==6.2.3"


@dataclass(frozen=True, slots=True)
class Entry:
    """What the manifest records beyond what ``describe`` reads off the file."""

    how: str
    source: str
    notes: str
    ort_input_shapes: dict[str, list[int]]
    ort_input_values: dict[str, Any] | None = None
    """Inputs that need a specific value (a sample rate), not random data."""
    ort_input_ranges: dict[str, list[float]] | None = None
    """[low, high) of the random floats for an input, where the default [0, 1) is not meant."""
    category: str = "random-weights-export"
    """As in the original five; ``shipped-model`` for trained files copied from a wheel, ``synthetic``."""
    data_dependent_tensors: tuple[str, ...] = ()
    """Tensors whose size depends on values; the oracle's inputs drive them to their upper bound."""


# ---------------------------------------------------------------------------------------------
# torch exports


def torch_how(dynamic: str, attention: str = "eager attention") -> str:
    import torch

    return f"torch=={torch.__version__} torch.onnx.export(dynamo=False, opset={OPSET}), {attention}, {dynamic}"


def export_torch(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    inputs: list[str],
    outputs: list[str],
    axes: dict,
    no_grad: bool = True,
) -> None:
    """``torch.onnx.export`` as the exports here are made: TorchScript exporter, opset 17,
    ``dynamic_axes``, constant folding. torch itself moves the weights to external data (one file
    per tensor beside ``path``) when the model is over protobuf's 2 GB; under it they stay inline.
    ``no_grad=False`` traces with autograd on, as torch's own export tutorial does: under
    ``torch.no_grad()`` ``nn.MultiheadAttention`` takes its fused fast path
    (``aten::_native_multi_head_attention``), which the TorchScript exporter cannot export."""
    import contextlib

    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    module.eval()
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            do_constant_folding=True,
        )


def _gpt2_config() -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=256,
        vocab_size=1000,
        attn_implementation="eager",
        use_cache=True,
    )


def _flat_cache(cache: Any) -> list[Any]:
    """present.{i}.key, present.{i}.value for every layer of a transformers Cache."""
    flat = []
    for layer in cache.layers:
        flat += [layer.keys, layer.values]
    return flat


def export_gpt2_kv(path: Path) -> Entry:
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    config = _gpt2_config()
    model = GPT2LMHeadModel(config)

    class WithPresent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, ...]:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
            return (out.logits, *_flat_cache(out.past_key_values))

    presents = [f"present.{i}.{kv}" for i in range(config.n_layer) for kv in ("key", "value")]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes |= {name: {0: "batch", 2: "sequence"} for name in presents}
    ids = torch.randint(0, config.vocab_size, (1, 8))
    export_torch(
        WithPresent(),
        (ids, torch.ones_like(ids)),
        path,
        ["input_ids", "attention_mask"],
        ["logits", *presents],
        axes,
    )
    return Entry(
        how=torch_how("dynamic batch/sequence, use_cache=True"),
        source="transformers GPT-2 architecture config, torch.manual_seed(0)",
        notes="GPT-2 architecture, 2 layers, hidden 64, 4 heads, vocab 1000, random weights; "
        "present key/value of every layer are graph outputs (optimum decoder_model layout)",
        ort_input_shapes={"input_ids": [1, 128], "attention_mask": [1, 128]},
    )


def export_gpt2_past(path: Path) -> Entry:
    import torch
    from transformers import DynamicCache, GPT2LMHeadModel

    torch.manual_seed(0)
    config = _gpt2_config()
    model = GPT2LMHeadModel(config)
    layers = config.n_layer

    class WithPast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *past: Any) -> tuple[Any, ...]:
            cache = DynamicCache(
                ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)],
                config=config,
            )
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *_flat_cache(out.past_key_values))

    pasts = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    presents = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes |= {name: {0: "batch", 2: "past_sequence"} for name in pasts}
    axes |= {name: {0: "batch", 2: "past_sequence + sequence"} for name in presents}
    head = config.n_embd // config.n_head
    past_len, seq = 6, 2
    ids = torch.randint(0, config.vocab_size, (1, seq))
    past = [torch.randn(1, config.n_head, past_len, head) for _ in pasts]
    mask = torch.ones(1, past_len + seq, dtype=torch.int64)
    export_torch(
        WithPast(),
        (ids, mask, *past),
        path,
        ["input_ids", "attention_mask", *pasts],
        ["logits", *presents],
        axes,
    )
    shapes = {"input_ids": [1, 1], "attention_mask": [1, 128]} | {
        name: [1, 4, 127, 16] for name in pasts
    }
    return Entry(
        how=torch_how("dynamic batch/sequence/past_sequence, use_cache=True with past inputs"),
        source="transformers GPT-2 architecture config, torch.manual_seed(0)",
        notes="GPT-2 architecture, 2 layers, hidden 64, 4 heads, vocab 1000, random weights; past key/values "
        "are inputs and present key/values outputs (optimum decoder_with_past layout); the ORT run is one "
        "decode step after 127 cached tokens",
        ort_input_shapes=shapes,
    )


def export_mobilenet_v2(path: Path) -> Entry:
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    config = MobileNetV2Config(depth_multiplier=0.35, tf_padding=True, num_labels=10)
    model = MobileNetV2ForImageClassification(config)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values=pixel_values).logits

    axes = {"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
    export_torch(Logits(), (torch.randn(1, 3, 224, 224),), path, ["pixel_values"], ["logits"], axes)
    return Entry(
        how=torch_how("dynamic batch/height/width"),
        source="transformers MobileNetV2 architecture config (depth_multiplier 0.35, tf_padding), torch.manual_seed(0)",
        notes="MobileNetV2 at depth multiplier 0.35, TensorFlow 'SAME' padding computed from the input size "
        "(Pad with computed pads), random weights",
        ort_input_shapes={"pixel_values": [1, 3, 224, 224]},
    )


# ---------------------------------------------------------------------------------------------
# pure-torch modules (bench/tiny_torch_models.py): the architecture kinds of issue #27


def _pure_torch(name: str) -> Any:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tiny_torch_models

    torch.manual_seed(0)
    return getattr(tiny_torch_models, name)()


def export_window_attention(path: Path) -> Entry:
    import torch

    axes = {"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
    export_torch(
        _pure_torch("TinySwin"),
        (torch.randn(1, 3, 100, 100),),
        path,
        ["pixel_values"],
        ["logits"],
        axes,
    )
    return Entry(
        how=torch_how("dynamic batch/height/width, pure torch module"),
        source="bench/tiny_torch_models.py TinySwin, torch.manual_seed(0)",
        notes="Swin-style window attention (window 7, dim 32, 2 heads, second block shifted by "
        "torch.roll), patch merging; every Pad amount is (7 - size % 7) % 7 of the runtime height "
        "and width, so only the input shape decides them (100×100 → 25×25 patches → padded to 28)",
        ort_input_shapes={"pixel_values": [1, 3, 100, 100]},
    )


def export_unet_attn64(path: Path) -> Entry:
    import torch

    axes = {"sample": {0: "batch"}, "out_sample": {0: "batch"}}
    export_torch(
        _pure_torch("TinyUNet"),
        (torch.randn(1, 4, 64, 64), torch.tensor([10.0])),
        path,
        ["sample", "timestep"],
        ["out_sample"],
        axes,
    )
    return Entry(
        how=torch_how("dynamic batch, pure torch module"),
        source="bench/tiny_torch_models.py TinyUNet, torch.manual_seed(0)",
        notes="U-Net with timestep embedding, GroupNorm/SiLU res blocks (channels 16/32) and one-head "
        "self-attention over the whole 64×64 latent: a [4096, 4096] score matrix and its Softmax",
        ort_input_shapes={"sample": [1, 4, 64, 64], "timestep": [1]},
    )


def export_gpt_decoder(path: Path) -> Entry:
    import torch

    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    ids = torch.randint(0, 1000, (1, 8))
    export_torch(
        _pure_torch("TinyGPT"),
        (ids, torch.ones_like(ids)),
        path,
        ["input_ids", "attention_mask"],
        ["logits"],
        axes,
    )
    return Entry(
        how=torch_how("dynamic batch/sequence, pure torch module"),
        source="bench/tiny_torch_models.py TinyGPT, torch.manual_seed(0)",
        notes="GPT-2-style decoder, 2 layers, hidden 64, 4 heads, vocab 1000: positions from arange, "
        "causal mask from tril of the sequence length, padding mask, tanh GELU, tied LM head",
        ort_input_shapes={"input_ids": [1, 128], "attention_mask": [1, 128]},
    )


def export_bert_encoder(path: Path) -> Entry:
    import torch

    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes |= {"last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}}
    ids = torch.randint(0, 1000, (1, 8))
    export_torch(
        _pure_torch("TinyBert"),
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        path,
        names,
        ["last_hidden_state", "pooler_output"],
        axes,
    )
    return Entry(
        how=torch_how("dynamic batch/sequence, pure torch module"),
        source="bench/tiny_torch_models.py TinyBert, torch.manual_seed(0)",
        notes="BERT encoder, 2 layers, hidden 64, 4 heads, vocab 1000: word/position/token-type "
        "embeddings, extended attention mask, post-norm layers with erf GELU, tanh pooler",
        ort_input_shapes={
            "input_ids": [1, 128],
            "attention_mask": [1, 128],
            "token_type_ids": [1, 128],
        },
    )


# ---------------------------------------------------------------------------------------------
# torchvision's window-attention family (issue 36): the real classes at a reduced width


_VISION_AXES = {"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
_REDUCED = "torchvision's own class at reduced width (the real depths, windows and 224x224 input)"


def _torchvision_export(module: Any, path: Path, what: str, notes: str) -> Entry:
    import torch
    import torchvision

    export_torch(
        module, (torch.randn(1, 3, 224, 224),), path, ["pixel_values"], ["logits"], _VISION_AXES
    )
    return Entry(
        how=torch_how("dynamic batch/height/width") + f", torchvision=={torchvision.__version__}",
        source=f"{what}, torch.manual_seed(0)",
        notes=notes,
        ort_input_shapes={"pixel_values": [1, 3, 224, 224]},
    )


def _swin(v2: bool) -> Any:
    """swin_t / swin_v2_t as torchvision builds them, embed_dim 16 (96 in the real ones)."""
    import torch
    from torchvision.models import swin_transformer as swin

    torch.manual_seed(0)
    extra = {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2}
    return swin.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=16,
        depths=[2, 2, 6, 2],
        num_heads=[1, 2, 4, 8],
        window_size=[8, 8] if v2 else [7, 7],
        stochastic_depth_prob=0.2,
        num_classes=10,
        **(extra if v2 else {}),
    )


_SWIN_NOTES = {
    False: "swin_t's depths [2, 2, 6, 2], window 7, shifted windows, patch merging",
    True: "swin_v2_t's depths [2, 2, 6, 2], window 8, SwinTransformerBlockV2 (cosine attention, "
    "continuous position bias MLP), PatchMergingV2",
}


def export_swin(path: Path, *, v2: bool) -> Entry:
    name = "swin_v2_t" if v2 else "swin_t"
    return _torchvision_export(
        _swin(v2=v2),
        path,
        f"torchvision.models.swin_transformer.SwinTransformer as {name}, {_REDUCED}",
        f"{_SWIN_NOTES[v2]}, at embed_dim 16 (heads [1, 2, 4, 8]) instead of 96, 10 classes: every "
        "window pad and shift mask is computed from the runtime height and width, each stage's from "
        "the previous stage's padded output",
    )


def export_maxvit_t(path: Path) -> Entry:
    import torch
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    model = MaxVit(
        input_size=(224, 224),
        stem_channels=8,
        partition_size=7,
        block_channels=[8, 16, 32, 64],
        block_layers=[2, 2, 5, 2],
        head_dim=8,
        stochastic_depth_prob=0.2,
        num_classes=10,
    )
    return _torchvision_export(
        model,
        path,
        f"torchvision.models.maxvit.MaxVit as maxvit_t, {_REDUCED}",
        "maxvit_t's block layers [2, 2, 5, 2], partition 7 (block and grid attention), MBConv with "
        "squeeze-excitation, at stem 8 and block channels [8, 16, 32, 64] (head_dim 8) instead of "
        "64 and [64, 128, 256, 512] (head_dim 32), 10 classes",
    )


# ---------------------------------------------------------------------------------------------
# models shipped in PyPI wheels


def from_wheel(requirement: str, member: str, path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, requirement],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, path.open("wb") as dst:
            shutil.copyfileobj(src, dst)


def copy_ppocr_cls(path: Path) -> Entry:
    from_wheel(RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", path)
    return Entry(
        how=f"copied from the {RAPIDOCR} wheel (rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx)",
        source="PaddleOCR ch_ppocr_mobile_v2.0_cls, trained weights, paddle2onnx export (Apache-2.0)",
        notes="PaddleOCR text-direction classifier (MobileNetV3-small); input dims are -1, '?', '?' "
        "(height and width share the anonymous name '?'), so only whole input shapes fix them; "
        "the det model of the same wheel (4.7 MB) is over the size budget",
        ort_input_shapes={"x": [1, 3, 48, 192]},
        category="shipped-model",
    )


def copy_silero_vad(path: Path) -> Entry:
    from_wheel(SILERO, "silero_vad/data/silero_vad_16k_op15.onnx", path)
    return Entry(
        how=f"copied from the {SILERO} wheel (silero_vad/data/silero_vad_16k_op15.onnx)",
        source="Silero VAD v6 16 kHz, trained weights, torch.onnx export opset 15 (MIT)",
        notes="voice-activity detector: STFT Conv front end, encoder, LSTM decoder inside nested If bodies "
        "(3 top-level If, 5 more inside); sr is a scalar input that selects the branch",
        ort_input_shapes={"input": [1, 512], "state": [2, 1, 128], "sr": []},
        ort_input_values={"sr": 16000},
        category="shipped-model",
    )


# ---------------------------------------------------------------------------------------------
# built with onnx.helper


def build_data_dependent(path: Path) -> Entry:
    """x [batch, n] -> a dense layer, then NonZero of (h > 0) and a TopK whose k counts positives."""
    rng = np.random.default_rng(0)
    hidden = 256
    weight = helper.make_tensor(
        "dense.weight",
        TensorProto.FLOAT,
        [64, hidden],
        rng.uniform(0.0, 0.1, (64, hidden)).astype(np.float32).ravel(),
    )
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    row_axis = helper.make_tensor("row_axis", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("MatMul", ["x", "dense.weight"], ["h"], name="dense"),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu"),
        helper.make_node("Greater", ["h_relu", "zero"], ["positive"], name="is_positive"),
        helper.make_node("NonZero", ["positive"], ["where"], name="nonzero"),
        helper.make_node("Transpose", ["where"], ["where_t"], name="where_transpose", perm=[1, 0]),
        helper.make_node("GatherND", ["h_relu", "where_t"], ["picked"], name="gather_positive"),
        helper.make_node("ReduceSum", ["picked"], ["picked_sum"], name="sum_positive", keepdims=0),
        helper.make_node(
            "Cast", ["positive"], ["positive_i"], name="positive_int", to=TensorProto.INT64
        ),
        helper.make_node(
            "ReduceSum", ["positive_i", "row_axis"], ["count"], name="count_positive", keepdims=0
        ),
        helper.make_node("ReduceMin", ["count"], ["k"], name="k_of_batch", keepdims=1),
        helper.make_node(
            "TopK", ["h_relu", "k"], ["top_values", "top_indices"], name="topk", axis=-1
        ),
        helper.make_node(
            "ReduceMean", ["top_values"], ["top_mean"], name="mean_top", axes=[1], keepdims=0
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "data_dependent",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("picked_sum", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("top_mean", TensorProto.FLOAT, ["batch"]),
        ],
        [weight, zero, row_axis],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnx.helper"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return Entry(
        how=f"onnx=={onnx.__version__} onnx.helper, opset {OPSET}",
        source="bench/export_models.py build_data_dependent, numpy default_rng(0) weights",
        notes="NonZero (output [2, count]) and TopK with k = per-row count of positive activations: sizes that "
        "depend on values. The ORT run feeds x in [0.5, 1.5) with non-negative weights, so every activation is "
        "positive and both reach their upper bound (NonZero: batch*256 indices, TopK: k = 256)",
        ort_input_shapes={"x": [2, 64]},
        ort_input_ranges={"x": [0.5, 1.5]},
        category="synthetic",
        data_dependent_tensors=("where", "where_t", "picked", "top_values", "top_indices"),
    )


BUILDERS: dict[str, Callable[[Path], Entry]] = {
    "tiny_gpt2_kv": export_gpt2_kv,
    "tiny_gpt2_past": export_gpt2_past,
    "tiny_mobilenet_v2": export_mobilenet_v2,
    "ppocr_cls": copy_ppocr_cls,
    "silero_vad": copy_silero_vad,
    "data_dependent": build_data_dependent,
    "window_attention": export_window_attention,
    "unet_attn64": export_unet_attn64,
    "gpt_decoder": export_gpt_decoder,
    "bert_encoder": export_bert_encoder,
    "swin_t": functools.partial(export_swin, v2=False),
    "swin_v2_t": functools.partial(export_swin, v2=True),
    "maxvit_t": export_maxvit_t,
}


# ---------------------------------------------------------------------------------------------
# manifest


def input_dims(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Each graph input's dims as the file declares them: an int, a dim_param, or None (anonymous)."""
    initializers = {t.name for t in model.graph.initializer}
    out: dict[str, list[int | str | None]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims: list[int | str | None] = []
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            else:
                dims.append(dim.dim_param or None)
        out[value.name] = dims
    return out


def _walk(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                nodes += _walk(sub)
    return nodes


def _subgraph_initializer_bytes(graph: onnx.GraphProto, top: bool = True) -> int:
    total = 0 if top else sum(t.ByteSize() for t in graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            total += sum(_subgraph_initializer_bytes(sub, top=False) for sub in subs)
    return total


def _ort_feed(model: onnx.ModelProto, entry: Entry) -> dict[str, np.ndarray]:
    sys.path[:0] = [
        str(ROOT),
        str(ROOT / "tests"),
    ]  # the export venv need not have sharderd installed
    from graph_oracle import make_inputs  # the same inputs the test oracle feeds

    return make_inputs(
        model, entry.ort_input_shapes, values=entry.ort_input_values, ranges=entry.ort_input_ranges
    )


def describe(name: str, path: Path, entry: Entry) -> dict[str, Any]:
    """The manifest entry: the keys of the original five, plus input_dims and the ORT extras."""
    import onnxruntime as ort

    model = onnx.load(path)
    graph = model.graph
    all_nodes = _walk(graph)
    initializers = list(graph.initializer)
    params = sum(int(np.prod(t.dims)) for t in initializers)
    param_bytes = sum(len(t.raw_data) or t.ByteSize() for t in initializers)
    names = [n.name for n in graph.node]
    unnamed = sum(1 for n in names if not n)
    duplicates = len(names) - len(set(names)) - max(unnamed - 1, 0)
    checker_ok = True
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        checker_ok = False
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        shape_ok, value_info = True, len(inferred.graph.value_info)
    except Exception:
        shape_ok, value_info = False, 0
    feed = _ort_feed(model, entry)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    results = session.run(None, feed)
    ort_seconds = time.perf_counter() - start
    outputs = [o.name for o in session.get_outputs()]
    constant_bytes = sum(
        a.t.ByteSize()
        for n in graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    )
    record: dict[str, Any] = {
        "category": entry.category,
        "checker_ok": checker_ok,
        "constant_node_bytes": constant_bytes,
        "duplicate_names_after": duplicates,
        "duplicate_names_before": duplicates,
        "external_data": False,
        "file_bytes": path.stat().st_size,
        "files": [path.name],
        "how": entry.how,
        "initializers": len(initializers),
        "input_dims": input_dims(model),
        "inputs": list(input_dims(model)),
        "ir_version": model.ir_version,
        "name": name,
        "nodes": len(graph.node),
        "nodes_incl_subgraphs": len(all_nodes),
        "notes": entry.notes,
        "op_histogram_top": dict(
            sorted(collections.Counter(n.op_type for n in graph.node).most_common(12))
        ),
        "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "ort_input_shapes": entry.ort_input_shapes,
        "ort_ok": True,
        "ort_output_shapes": {n: list(np.shape(r)) for n, r in zip(outputs, results, strict=True)},
        "ort_outputs_finite": all(
            np.isfinite(r).all() for r in results if np.issubdtype(r.dtype, np.floating)
        ),
        "ort_seconds": round(ort_seconds, 3),
        "outputs": outputs,
        "param_bytes": param_bytes,
        "param_count": params,
        "path": f"{name}/{path.name}",
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "shape_inference_ok": shape_ok,
        "source": entry.source,
        "subgraph_initializer_bytes": _subgraph_initializer_bytes(graph),
        "subgraphs": sum(
            len(a.graphs) + (a.type == onnx.AttributeProto.GRAPH)
            for n in all_nodes
            for a in n.attribute
        ),
        "unnamed_nodes_after": unnamed,
        "unnamed_nodes_before": unnamed,
        "value_info_after_inference": value_info,
    }
    if entry.ort_input_values:
        record["ort_input_values"] = entry.ort_input_values
    if entry.ort_input_ranges:
        record["ort_input_ranges"] = entry.ort_input_ranges
    if entry.data_dependent_tensors:
        record["data_dependent_tensors"] = list(entry.data_dependent_tensors)
    return record


def write_manifest(records: dict[str, dict[str, Any]]) -> None:
    """Merge ``records`` into the manifest; every entry (the original five too) gets ``input_dims``."""
    manifest = json.loads(MANIFEST.read_text())
    manifest.update(records)
    for name, record in manifest.items():
        if "input_dims" not in record:
            record["input_dims"] = input_dims(
                onnx.load(MODELS / record["path"], load_external_data=False)
            )
        manifest[name] = dict(sorted(record.items()))
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1, sort_keys=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"models to build (default: all): {', '.join(BUILDERS)}"
    )
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILDERS)}")
    records = {}
    for name in args.names or list(BUILDERS):
        path = MODELS / name / "model.onnx"
        entry = BUILDERS[name](path)
        records[name] = describe(name, path, entry)
        print(
            f"{name}: {records[name]['nodes']} nodes, {path.stat().st_size / 1e6:.2f} MB",
            flush=True,
        )
    write_manifest(records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
