"""Inputs for the daemon's fuzz campaign, by kind: what one drop into an inbox renames in.

``make_input(index, kind, rng, staging)`` writes one input into ``staging`` (same filesystem as the
inbox) and returns what to rename in, in order (a sidecar before its model). Every name carries the
token ``i<index>`` (``i0042``), so a journal record (whose name is ``filenames.safe_name`` of it)
tells which input it was. Kinds:

- ``valid``: a small chain model (seeded: some repeat, and are duplicates);
- ``byte_flip`` / ``truncation``: a valid model with 1-16 bits flipped / cut short anywhere;
- ``semantics``: a case of the bad-input corpus (``tests/corpus.py``): cycles, dangling inputs,
  bad opsets, absurd dims, external data pointing outside...;
- ``odd_name``: a valid or broken model under a name that is not UTF-8, 255 bytes long, holds a
  newline, a quote, starts with a dash...;
- ``deep_nesting``: a folder job with 40 nested folders beside its model, or a model whose ``If``
  nodes nest 2-10 deep;
- ``special_file``: a FIFO, a character device, symbolic and hard links, a folder named ``.onnx``,
  an empty file, a folder with two models, files that are no job (left in the inbox);
- ``sidecar``: a valid model with a broken or random sidecar;
- ``deep_if``: ``If`` nested 14-20 deep: planning time doubles per level (known: issue 40 item 3,
  planning limits, is another change);
- ``bad_dtype``: an initializer of data type 0, -3 or 999 (known: issue 40 item 4, validation).
"""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
from corpus import MODEL_CASES, SIDECAR_CASES, small_model
from onnx import TensorProto, helper

from sharderd import examples

__all__ = ["KINDS", "KNOWN", "WEIGHTS", "Input", "deep_if_model", "make_input", "token_of"]

KINDS = (
    "valid",
    "byte_flip",
    "truncation",
    "semantics",
    "odd_name",
    "deep_nesting",
    "special_file",
    "sidecar",
    "deep_if",
    "bad_dtype",
)
WEIGHTS = (20, 15, 10, 15, 15, 5, 10, 6, 2, 2)
"""How often each kind is drawn (per 100)."""
KNOWN = {
    "deep_if": "issue 40 item 3 (planning limits): planning time doubles per If level",
    "bad_dtype": "issue 40 item 4 (validation): an unknown data type crashes the planning worker",
}
"""Kinds whose pathology another change fixes: recorded, not counted against the daemon."""
_SKIP_CASES = frozenset({"sparse-10gb", "missing-file"})
"""Corpus cases too slow for a campaign (a 10 GiB sparse file) or that write nothing."""


@dataclass(frozen=True, slots=True)
class Input:
    index: int
    kind: str
    entries: tuple[Path, ...]
    """What to rename into the inbox, in order, each under its own name."""
    job: bool
    """Whether the intake takes it as a job (else it must stay in the inbox, untouched)."""
    detail: str
    """What exactly it is (for a report row)."""


def token_of(index: int) -> str:
    return f"i{index:04d}"


def make_input(index: int, kind: str, rng: random.Random, staging: Path) -> Input:
    folder = staging / token_of(index)
    folder.mkdir(parents=True)
    entries, job, detail = _BUILDERS[kind](folder, token_of(index), rng)
    return Input(index, kind, tuple(entries), job, detail)


Built = tuple[list[Path], bool, str]


def _valid_bytes(rng: random.Random) -> bytes:
    """One of 40 small chain models: a campaign meets the same bytes again (duplicates)."""
    model = examples.chain(nodes=rng.randint(4, 12), hidden=4, seed=rng.randrange(40))
    return model.SerializeToString()


def _named(folder: Path, raw: bytes, data: bytes) -> Path:
    path = folder / os.fsdecode(raw)
    path.write_bytes(data)
    return path


def _valid(folder: Path, token: str, rng: random.Random) -> Built:
    return [_named(folder, f"{token}.onnx".encode(), _valid_bytes(rng))], True, "chain"


def _byte_flip(folder: Path, token: str, rng: random.Random) -> Built:
    data = bytearray(_valid_bytes(rng))
    flips = rng.randint(1, 16)
    for _ in range(flips):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return [_named(folder, f"{token}.onnx".encode(), bytes(data))], True, f"{flips} bits"


def _truncation(folder: Path, token: str, rng: random.Random) -> Built:
    data = _valid_bytes(rng)
    keep = rng.randrange(len(data))
    return [_named(folder, f"{token}.onnx".encode(), data[:keep])], True, f"{keep}/{len(data)} B"


def _semantics(folder: Path, token: str, rng: random.Random) -> Built:
    name = rng.choice(sorted(set(MODEL_CASES) - _SKIP_CASES))
    build = folder / "build"
    build.mkdir()
    MODEL_CASES[name].build(build)
    entries = []
    for entry in sorted(build.iterdir()):
        if entry.suffix == ".onnx" or (entry.is_dir() and not entry.is_symlink()):
            entries.append(entry.rename(folder / f"{token}-{entry.name}"))
    job = any(_is_job(p) for p in entries)
    return entries, job, name


def _is_job(path: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return path.suffix.lower() == ".onnx"
    return any(p.suffix.lower() == ".onnx" and not p.name.startswith(".") for p in path.iterdir())


_ODD: dict[str, Callable[[str], bytes]] = {
    "latin-1": lambda t: f"{t}-".encode() + b"\xe9t\xe9",
    "255 bytes": lambda t: t.encode() + b"n" * (250 - len(t)),
    "newline": lambda t: f"{t}\nsecond line".encode(),
    "dash": lambda t: f"-{t}".encode(),
    "double dash": lambda t: f"--{t}".encode(),
    "shell": lambda t: f"{t} $(touch x) `y` 'q' \"d\" \\".encode(),
    "unicode": lambda t: f"{t}-模型-é-🙂".encode(),
    "percent": lambda t: f"{t}-%E9%0A".encode(),
    "control": lambda t: f"{t}\x01\x7f\x1b[31m".encode(),
    "tab": lambda t: f"{t}\tx".encode(),
}


def _odd_name(folder: Path, token: str, rng: random.Random) -> Built:
    style = rng.choice(sorted(_ODD))
    good = rng.random() < 0.5
    data = _valid_bytes(rng) if good else b"not a model " + token.encode()
    path = _named(folder, _ODD[style](token) + b".onnx", data)
    return [path], True, f"{style}, {'valid' if good else 'broken'}"


def deep_if_model(depth: int) -> onnx.ModelProto:
    """``y = x + 1`` under ``depth`` nested ``If`` nodes (then: the next level; else: the leaf),
    then a Relu and an Add (three top-level nodes: two stages can be planned)."""

    def leaf(tag: str) -> onnx.GraphProto:
        node = helper.make_node("Add", ["x", "one"], [f"y_{tag}"], name=f"add_{tag}")
        out = helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, [1, 4])
        return helper.make_graph([node], f"g_{tag}", [], [out])

    def level(k: int) -> onnx.GraphProto:
        if k == depth:
            return leaf(f"t{k}")
        node = helper.make_node(
            "If",
            ["cond"],
            [f"y_{k}"],
            name=f"if_{k}",
            then_branch=level(k + 1),
            else_branch=leaf(f"e{k}"),
        )
        out = helper.make_tensor_value_info(f"y_{k}", TensorProto.FLOAT, [1, 4])
        return helper.make_graph([node], f"level_{k}", [], [out])

    top = level(0)
    after = [  # work after the If, so that a split into two stages exists
        helper.make_node("Relu", ["y_0"], ["r0"], name="relu0"),
        helper.make_node("Add", ["r0", "one"], ["r1"], name="add_out"),
    ]
    graph = helper.make_graph(
        [*top.node, *after],
        "deep_if",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("r1", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1, 4], [1.0] * 4)],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", examples.OPSET)],
        ir_version=examples.IR_VERSION,
    )


def _deep_nesting(folder: Path, token: str, rng: random.Random) -> Built:
    if rng.random() < 0.5:
        depth = rng.randint(2, 10)
        path = _named(folder, f"{token}.onnx".encode(), deep_if_model(depth).SerializeToString())
        return [path], True, f"If {depth} deep"
    job = folder / token
    job.mkdir()
    (job / "model.onnx").write_bytes(_valid_bytes(rng))
    deep = job.joinpath(*(f"d{k}" for k in range(40)))
    deep.mkdir(parents=True)
    (deep / "notes.txt").write_text("deep")
    return [job], True, "folder 40 deep"


_SPECIAL = (
    "fifo",
    "device",
    "symlink",
    "symlink folder",
    "hard link",
    "folder .onnx",
    "empty",
    "two models",
    "not a job",
    "staging",
)


def _special_file(folder: Path, token: str, rng: random.Random) -> Built:
    style = rng.choice(_SPECIAL)
    path = folder / f"{token}.onnx"
    if style == "fifo":
        os.mkfifo(path)
    elif style == "device":  # a character device like /dev/null (root only; else a FIFO)
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            os.mkfifo(path)
    elif style == "symlink":
        path.symlink_to("/etc/hostname")
    elif style == "symlink folder":
        path = folder / token
        path.symlink_to("/etc")
    elif style == "hard link":
        outside = folder / "outside.bin"
        outside.write_bytes(_valid_bytes(rng))
        os.link(outside, path)
    elif style == "folder .onnx":
        path.mkdir()
        (path / "readme.txt").write_text("no model here")
        return [path], False, style
    elif style == "empty":
        path.write_bytes(b"")
    elif style == "two models":
        path = folder / token
        path.mkdir()
        (path / "a.onnx").write_bytes(_valid_bytes(rng))
        (path / "b.onnx").write_bytes(_valid_bytes(rng))
    elif style == "not a job":
        path = folder / f"{token}.txt"
        path.write_text("notes")
        return [path], False, style
    else:  # a writer's staging name: never a job
        path = folder / f".{token}.onnx.part"
        path.write_bytes(_valid_bytes(rng))
        return [path], False, style
    return [path], True, style


def _sidecar(folder: Path, token: str, rng: random.Random) -> Built:
    model = _named(folder, f"{token}.onnx".encode(), _valid_bytes(rng))
    side = folder / f"{token}.toml"
    if rng.random() < 0.6:
        case = rng.choice(sorted(SIDECAR_CASES))
        build = folder / "build"
        build.mkdir()
        SIDECAR_CASES[case](build).path.rename(side)
    else:
        case = "random bytes"
        side.write_bytes(rng.randbytes(rng.randint(0, 200)))
    return [side, model], True, case


def _deep_if(folder: Path, token: str, rng: random.Random) -> Built:
    depth = rng.randint(14, 20)
    path = _named(folder, f"{token}.onnx".encode(), deep_if_model(depth).SerializeToString())
    return [path], True, f"If {depth} deep"


def _bad_dtype(folder: Path, token: str, rng: random.Random) -> Built:
    model = small_model()
    dtype = rng.choice([0, -3, 999])
    model.graph.initializer[0].data_type = dtype
    path = _named(folder, f"{token}.onnx".encode(), model.SerializeToString())
    return [path], True, f"data_type {dtype}"


_BUILDERS: dict[str, Callable[[Path, str, random.Random], Built]] = {
    "valid": _valid,
    "byte_flip": _byte_flip,
    "truncation": _truncation,
    "semantics": _semantics,
    "odd_name": _odd_name,
    "deep_nesting": _deep_nesting,
    "special_file": _special_file,
    "sidecar": _sidecar,
    "deep_if": _deep_if,
    "bad_dtype": _bad_dtype,
}
