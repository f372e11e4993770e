"""An error raised through the Python API says its way out in Python, not in flags.

The engine says what gets past an error twice: ``hint`` in the command line's words
(``rerun with --devices 5``) and ``reruns``, the same as data (``{"devices": 5}``). A call of
``sharderd.plan``/``sharderd.shard`` keeps its arguments in a ``Call``; when an error leaves it, the
hint becomes the call to make instead, with the caller's own arguments and the changes:
``sharderd.plan('m.onnx', devices=5, name_nodes=True)``. Arguments that are not literals (a
``Config``, a ``Target``, a model in memory, a callback) are written by their parameter's name.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharderd.errors import DimsUnresolvedError, SharderdError

__all__ = ["Call"]


class _Placeholder:
    """A value the caller must choose; shown by its name (``SIZE``), explained after the call."""

    def __init__(self, name: str, meaning: str) -> None:
        self.name, self.meaning = name, meaning

    def __repr__(self) -> str:
        return self.name


SIZE = _Placeholder("SIZE", "the size to compile for")
SHAPE = _Placeholder("SHAPE", "the input's whole shape, a list of sizes")
_LITERALS = (bool, int, float, str, type(None), _Placeholder)


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the API: which function, on which model, with which arguments."""

    function: str
    """``plan`` or ``shard`` (``shard_async`` is the same call)."""
    model: object
    arguments: Mapping[str, Any]
    """The call's parameters by name (its ``locals()`` on entry)."""
    functions: Mapping[str, Callable[..., Any]]
    """The API's ``plan`` and ``shard``, whose signatures give each parameter's default (passed
    in, so that this module does not import the API that imports it)."""

    @contextmanager
    def hints(self) -> Iterator[None]:
        """Any ``SharderdError`` leaving the block gets its hint in Python terms."""
        try:
            yield
        except SharderdError as err:
            hint = self.hint(err)
            if hint is not None:
                err.hint = hint
            raise

    def hint(self, err: SharderdError) -> str | None:
        """The calls that get past ``err``; None leaves its hint (no flag in it) as it is."""
        reruns = list(err.reruns)
        if isinstance(err, DimsUnresolvedError) and err.dims:
            reruns.insert(0, _dims_rerun(err))
        if not reruns:
            return None
        calls = [self.render(rerun) for rerun in reruns]
        text = "call again as " + ", or as ".join(calls)
        used = [p for p in (SIZE, SHAPE) if any(p.name in c for c in calls)]
        return text + "".join(f" ({p.name}: {p.meaning})" for p in used)

    def render(self, changes: Mapping[str, Any]) -> str:
        """This call with ``changes``; a compile backend asked of ``plan`` becomes a ``shard``."""
        function = self.function
        values = dict(self.arguments)
        if "backend" in changes and function == "plan":
            function = "shard"
            values["out"] = f"{_stem(self.model)}.sharded"
        for key, value in changes.items():
            if key in ("dims", "input_shapes") and isinstance(values.get(key), Mapping):
                value = {**values[key], **value}
            values[key] = value
        parameters = inspect.signature(self.functions[function]).parameters
        parts = [_model(self.model)]
        for name, parameter in parameters.items():
            if name == "model" or name not in values:
                continue
            value = values[name]
            if parameter.default is not inspect.Parameter.empty and _same(value, parameter.default):
                continue
            parts.append(f"{name}={_literal(name, value)}")
        return f"sharderd.{function}({', '.join(parts)})"


def _dims_rerun(err: DimsUnresolvedError) -> dict[str, Any]:
    """Every open dim given a placeholder: named ones by ``dims``, anonymous ones by the input's
    whole shape (its static dims kept)."""
    named = {name: SIZE for _, _, name in err.dims if name}
    shapes: dict[str, Any] = {}
    for input_name, template in err.templates.items():
        if "<d0>" in template:
            shapes[input_name] = SHAPE
        else:
            shapes[input_name] = [
                SIZE if "<" in part else int(part) for part in template.split(",")
            ]
    return {**({"dims": named} if named else {}), **({"input_shapes": shapes} if shapes else {})}


def _same(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _model(model: object) -> str:
    return repr(os.fspath(model)) if isinstance(model, str | os.PathLike) else "model"


def _stem(model: object) -> str:
    if isinstance(model, str | os.PathLike):
        return Path(os.fspath(model)).name.removesuffix(".onnx")
    return "model"


def _literal(name: str, value: Any) -> str:
    """``value`` as Python source, or the parameter's name when it is no literal."""
    if isinstance(value, os.PathLike):
        return repr(os.fspath(value))
    if _plain(value):
        return repr(_as_plain(value))
    return name


def _plain(value: Any) -> bool:
    if isinstance(value, _LITERALS):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _as_plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _as_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_plain(v) for v in value]
    return value
