"""What crosses the planning worker's pipe: errors kept as their own types, and the corrections.

Only the worker (``job/planworker.py``) and its client (``job/session.py``) use this. An error
travels as its class (module and name, under ``sharderd``) and its instance fields, so every
``SharderdError`` subtype comes back as itself, with its exit code, reason and numbers, whatever
its constructor takes. Tuples come back as tuples (JSON has lists only; no error field is a list).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from sharderd.errors import SharderdError
from sharderd.plan.content import ContentCorrection

__all__ = ["decode_content", "decode_error", "encode_error"]

_NESTED = "__sharderd_error__"


def encode_error(error: SharderdError) -> dict[str, Any]:
    """The error's class and fields as JSON-ready values."""
    cls = type(error)
    fields = {k: _encode(v) for k, v in vars(error).items()}
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}


def decode_error(data: Mapping[str, Any]) -> SharderdError:
    """The error ``encode_error`` wrote, of the same class; a plain ``SharderdError`` when the
    payload names no sharderd error class (a worker of another version)."""
    fields = {k: _decode(v) for k, v in dict(data.get("fields") or {}).items()}
    message = str(fields.get("message", "planning failed"))
    cls = _error_class(str(data.get("class", "")))
    if cls is None:
        return SharderdError(message, hint=fields.get("hint"))
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    vars(error).update(fields)
    return error


def _error_class(name: str) -> type[SharderdError] | None:
    module, _, qualname = name.partition(":")
    if not module.startswith("sharderd.") or not qualname or "." in qualname:
        return None
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, SharderdError) else None


def _encode(value: Any) -> Any:
    if isinstance(value, SharderdError):
        return {_NESTED: encode_error(value)}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, Mapping):
        if set(value) == {_NESTED}:
            return decode_error(value[_NESTED])
        return {k: _decode(v) for k, v in value.items()}
    return value


def decode_content(data: Mapping[str, Any] | None) -> ContentCorrection | None:
    """A ``ContentCorrection`` sent as ``dataclasses.asdict`` JSON (a plan request's)."""
    if data is None:
        return None

    def runs(key: str) -> tuple[tuple[tuple[tuple[int, int], ...], float], ...]:
        return tuple(
            (tuple((int(a), int(b)) for a, b in r), float(f)) for r, f in data.get(key, ())
        )

    return ContentCorrection(
        float(data["base"]),
        runs("patches"),
        runs("measured"),
        runs("fixed"),
        bool(data.get("fixed_on_heaviest", False)),
    )
