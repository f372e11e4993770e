"""The stock full-size models of ``stock_exports.py``: how each is built and exported, in the order
they are exported (``BUILDERS``). Each builder writes ``path`` and returns what it knows beyond the
file (``Exported``). torch, torchvision, transformers and diffusers are imported inside them."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from export_models import RAPIDOCR, Entry, export_torch, from_wheel, torch_how

SEQUENCE = 128
"""The sequence length the text models are planned at (issues 36 and 39 measure at 128)."""
TEXT_AXES = {0: "batch", 1: "sequence"}
BATCH_AXIS = {0: "batch"}


@dataclass(frozen=True, slots=True)
class Exported:
    """What a builder knows about its export beyond what the file says."""

    entry: Entry
    """How it was made, and ``ort_input_shapes``: the concrete shape of every graph input, to run
    onnxruntime and to plan at (``--input-shape NAME=D0,D1,..``)."""
    export_seconds: float
    """``torch.onnx.export`` alone (for the OCR model: download and unzip)."""
    plan_flags: tuple[str, ...] = ()
    """Other flags the model needs to plan (``--name-nodes`` where nodes have no names)."""


def _timed_export(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    no_grad: bool = True,
) -> float:
    start = time.perf_counter()
    export_torch(module, args, path, inputs, outputs, axes, no_grad)
    return time.perf_counter() - start


def _text_axes(names: list[str]) -> dict[str, dict[int, str]]:
    return {name: TEXT_AXES for name in names}


def _by_name(model: Any, inputs: list[str], outputs: list[str]) -> Any:
    """``model(**{inputs}).{outputs}`` as a module with positional inputs and a tuple out, as optimum
    wraps a transformers model: with transformers 5 a direct ``torch.onnx.export(model, ...)`` fails
    (BERT: "got multiple values for argument 'use_cache'") or turns ``logits_to_keep=0`` into a graph
    input that picks one position (GPT-2), because the TorchScript exporter passes every defaulted
    parameter of ``forward`` positionally. Initializer names gain the prefix ``model.``."""
    import torch

    class ByName(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *values: Any) -> tuple[Any, ...]:
            result = self.model(**dict(zip(inputs, values, strict=True)))
            return tuple(result[name] for name in outputs)

    return ByName()


# ---------------------------------------------------------------------------------------------
# transformers


def _gpt2(path: Path, **sizes: int) -> Exported:
    """GPT2LMHeadModel: input_ids and attention_mask in, logits out; no KV cache."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**sizes, attn_implementation="eager", use_cache=False)
    names = ["input_ids", "attention_mask"]
    model = _by_name(GPT2LMHeadModel(config), names, ["logits"])
    ids = torch.randint(0, config.vocab_size, (1, 8))
    seconds = _timed_export(
        model,
        (ids, torch.ones_like(ids)),
        path,
        names,
        ["logits"],
        _text_axes([*names, "logits"]),
    )
    size = f"{config.n_layer} layers, hidden {config.n_embd}, {config.n_head} heads"
    return Exported(
        Entry(
            how=torch_how("dynamic batch/sequence, use_cache=False"),
            source=f"transformers GPT2LMHeadModel(GPT2Config({size})), torch.manual_seed(0)",
            notes=f"GPT-2 LM head, {size}, vocab {config.vocab_size}, tied embedding; logits only",
            ort_input_shapes={"input_ids": [1, SEQUENCE], "attention_mask": [1, SEQUENCE]},
        ),
        seconds,
    )


def _bert(path: Path, **sizes: int) -> Exported:
    """BertModel with its pooler: last_hidden_state and pooler_output."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(**sizes, attn_implementation="eager")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    outputs = ["last_hidden_state", "pooler_output"]
    model = _by_name(BertModel(config), names, outputs)
    ids = torch.randint(0, config.vocab_size, (1, 8))
    axes = _text_axes([*names, "last_hidden_state"]) | {"pooler_output": BATCH_AXIS}
    seconds = _timed_export(
        model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), path, names, outputs, axes
    )
    size = (
        f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads"
    )
    return Exported(
        Entry(
            how=torch_how("dynamic batch/sequence"),
            source=f"transformers BertModel(BertConfig({size})), torch.manual_seed(0)",
            notes=f"BERT encoder with pooler, {size}, vocab {config.vocab_size}",
            ort_input_shapes={name: [1, SEQUENCE] for name in names},
        ),
        seconds,
    )


def _vit_hf(path: Path) -> Exported:
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(attn_implementation="eager")  # base, patch 16, 224; forward takes one input
    model = ViTModel(config, add_pooling_layer=True)
    seconds = _timed_export(
        model,
        (torch.randn(1, 3, 224, 224),),
        path,
        ["pixel_values"],
        ["last_hidden_state", "pooler_output"],
        {"pixel_values": BATCH_AXIS, "last_hidden_state": BATCH_AXIS, "pooler_output": BATCH_AXIS},
    )
    return Exported(
        Entry(
            how=torch_how("dynamic batch"),
            source="transformers ViTModel(ViTConfig()) (ViT-B/16, 224), torch.manual_seed(0)",
            notes="ViT base, patch 16, 12 layers, hidden 768, with pooler",
            ort_input_shapes={"pixel_values": [1, 3, 224, 224]},
        ),
        seconds,
    )


# ---------------------------------------------------------------------------------------------
# torchvision, diffusers, the OCR wheel


def _torchvision(path: Path, arch: str, size: int = 224) -> Exported:
    """``torchvision.models.get_model(arch)``, input/output named as in torch's own tutorial. A model
    with ``nn.MultiheadAttention`` (vit_b_16) is traced with autograd on, as that tutorial does:
    under ``torch.no_grad()`` its fused fast path cannot be exported (``export_torch``)."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, weights=None)
    fused = any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())
    seconds = _timed_export(
        model,
        (torch.randn(1, 3, size, size),),
        path,
        ["input"],
        ["output"],
        {"input": BATCH_AXIS, "output": BATCH_AXIS},
        no_grad=not fused,
    )
    autograd = ", traced with autograd on (nn.MultiheadAttention)" if fused else ""
    return Exported(
        Entry(
            how=torch_how(f"dynamic batch{autograd}", attention="torchvision's model as defined"),
            source=f"torchvision=={torchvision.__version__} models.get_model({arch!r}, weights=None), "
            "torch.manual_seed(0)",
            notes=f"torchvision {arch}, 1000 classes, {size}x{size}",
            ort_input_shapes={"input": [1, 3, size, size]},
        ),
        seconds,
    )


def _sd_unet(path: Path) -> Exported:
    """Stable Diffusion 1.5's U-Net from its config, exported as diffusers'
    ``convert_stable_diffusion_checkpoint_to_onnx.py`` does (inputs, names, dynamic axes; its
    fourth argument ``False`` is left out: in today's ``forward`` that position is ``class_labels``)."""
    import diffusers
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(  # runwayml/stable-diffusion-v1-5 unet/config.json
        sample_size=64,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2,
        attention_head_dim=8,
        cross_attention_dim=768,
        norm_num_groups=32,
        act_fn="silu",
    )
    seconds = _timed_export(
        unet,
        (torch.randn(1, 4, 64, 64), torch.randn(1), torch.randn(1, 77, 768)),
        path,
        ["sample", "timestep", "encoder_hidden_states"],
        ["out_sample"],
        {
            "sample": {0: "batch", 1: "channels", 2: "height", 3: "width"},
            "timestep": BATCH_AXIS,
            "encoder_hidden_states": TEXT_AXES,
        },
    )
    return Exported(
        Entry(
            how=torch_how(
                "dynamic batch/channels/height/width/sequence as diffusers' ONNX script",
                attention="diffusers' default attention (scaled_dot_product_attention)",
            ),
            source=f"diffusers=={diffusers.__version__} UNet2DConditionModel with the Stable Diffusion "
            "1.5 config, torch.manual_seed(0)",
            notes="SD 1.5 U-Net (860M parameters), default attention processor "
            "(scaled_dot_product_attention); 64x64 latent, 77x768 text embedding",
            ort_input_shapes={
                "sample": [1, 4, 64, 64],
                "timestep": [1],
                "encoder_hidden_states": [1, 77, 768],
            },
        ),
        seconds,
    )


def _ocr_rec(path: Path) -> Exported:
    member = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
    start = time.perf_counter()
    from_wheel(RAPIDOCR, member, path)
    return Exported(
        Entry(
            how=f"copied from the {RAPIDOCR} wheel ({member})",
            source="PaddleOCR ch_PP-OCRv4_rec, trained weights, paddle2onnx export (Apache-2.0)",
            notes="PP-OCRv4 text recogniser (SVTR-LCNet, CTC head over 6625 characters); planned at "
            "RapidOCR's rec_img_shape 3x48x320",
            ort_input_shapes={"x": [1, 3, 48, 320]},
            category="shipped-model",
        ),
        time.perf_counter() - start,
        plan_flags=("--name-nodes",),  # paddle2onnx leaves 420 nodes unnamed: exit 2 without it
    )


def _vision(arch: str, size: int = 224) -> Callable[[Path], Exported]:
    return lambda path: _torchvision(path, arch, size)


GPT2_MEDIUM = {"n_layer": 24, "n_embd": 1024, "n_head": 16}
GPT2_XL = {"n_layer": 48, "n_embd": 1600, "n_head": 25}
BERT_LARGE = {
    "num_hidden_layers": 24,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}

BUILDERS: dict[str, Callable[[Path], Exported]] = {  # in the order they are exported
    "gpt2_medium": lambda path: _gpt2(path, **GPT2_MEDIUM),
    "gpt2": lambda path: _gpt2(path),
    "bert_large": lambda path: _bert(path, **BERT_LARGE),
    "swin_t": _vision("swin_t"),
    "swin_s": _vision("swin_s"),
    "swin_v2_t": _vision("swin_v2_t"),
    "maxvit_t": _vision("maxvit_t"),
    "resnet50": _vision("resnet50"),
    "inception_v3": _vision("inception_v3", 299),
    "densenet121": _vision("densenet121"),
    "vit_b_16": _vision("vit_b_16"),
    "bert_base": lambda path: _bert(path),
    "resnet152": _vision("resnet152"),
    "ocr_rec": _ocr_rec,
    "sd_unet": _sd_unet,
    "gpt2_xl": lambda path: _gpt2(path, **GPT2_XL),
    "vit_base_hf": _vit_hf,
}
