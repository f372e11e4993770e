"""The loader: ``sharderd.toml`` text to one validated ``Config``; every error names its key.

Each table is checked against its dataclass's fields, so an unknown or mistyped key is an error
naming the file, the table and the key. Every such error carries the key's path in the document
(``LocatedError.path``); ``load_config`` turns it into a line number with the TOML scanner of
``sharderd.config.positions``, never by reading the message. The same machinery validates per-job
sidecars in the daemon (``load_table``).
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from sharderd.config.positions import line_of
from sharderd.config.schema import SECTIONS, Config, FieldError
from sharderd.errors import ConfigError
from sharderd.target import BUILTIN_TARGETS, Target

T = TypeVar("T")

__all__ = ["LocatedError", "config_from_dict", "load_config", "load_table", "parse_toml"]


class LocatedError(ConfigError):
    """A config error at ``path`` in the document: table names, then the key (``("plan", "dims")``)."""

    def __init__(self, message: str, *, path: Sequence[str], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = tuple(path)


def parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid TOML: nested too deeply") from None


def load_config(path: Path | None = None) -> Config:
    """Load and validate ``path``; ``None`` gives the defaults."""
    if path is None:
        return Config()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    data = parse_toml(text, str(path))
    try:
        return config_from_dict(data, str(path), source=path)
    except LocatedError as err:
        line = line_of(text, err.path)
        if line is None:
            raise
        rest = err.message.removeprefix(str(path)).lstrip(": ")
        raise ConfigError(f"{path}:{line}: {rest}", hint=err.hint) from None


def config_from_dict(data: Mapping[str, Any], where: str, *, source: Path | None = None) -> Config:
    known = {*SECTIONS, "target", "targets"}
    for key in data:
        if key not in known:
            raise LocatedError(
                f"{where}: unknown section or key {key!r} (known: {', '.join(sorted(known))})",
                path=(key,),
            )
    sections: dict[str, Any] = {
        name: load_table(cls, _table(data, name, where), f"{where} [{name}]", path=(name,))
        for name, cls in SECTIONS.items()
    }
    target_table = _table(data, "target", where)
    unknown = set(target_table) - {"name"}
    if unknown:
        key = sorted(unknown)[0]
        raise LocatedError(
            f"{where} [target]: unknown key {key!r} (known: name)", path=("target", key)
        )
    custom = {
        name: _custom_target(name, table, f"{where} [targets.{name}]")
        for name, table in _table(data, "targets", where).items()
    }
    config = Config(
        **sections,
        target_name=str(target_table.get("name", "ipu-mk2")),
        custom_targets=custom,
        source=source,
        plan_given=frozenset(_table(data, "plan", where)),
    )
    for section, name in (("target", None), ("daemon", config.daemon.target)):
        if section == "daemon" and name is None:
            continue
        try:
            config.target(name)
        except ConfigError as err:
            key = "name" if section == "target" else "target"
            raise LocatedError(
                f"{where} [{section}] {key}: {err.message}", path=(section, key)
            ) from None
    return config


def _table(data: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, Mapping):
        raise LocatedError(f"{where}: {name!r} must be a table", path=(name,))
    return value


_TARGET_KEYS = {f.name for f in fields(Target)} - {"name"}


def _custom_target(name: str, table: Mapping[str, Any], where: str) -> Target:
    at = ("targets", name)
    if not isinstance(table, Mapping):
        raise LocatedError(f"{where}: must be a table", path=at)
    base_name = table.get("base")
    values: dict[str, Any] = {}
    if base_name is not None:
        if not isinstance(base_name, str) or base_name not in BUILTIN_TARGETS:
            raise LocatedError(
                f"{where}: base {base_name!r} is not a built-in target ({', '.join(BUILTIN_TARGETS)})",
                path=(*at, "base"),
            )
        values = {f.name: getattr(BUILTIN_TARGETS[base_name], f.name) for f in fields(Target)}
    for key, value in table.items():
        if key == "base":
            continue
        if key not in _TARGET_KEYS:
            raise LocatedError(
                f"{where}: unknown key {key!r} (known: base, {', '.join(sorted(_TARGET_KEYS))})",
                path=(*at, key),
            )
        values[key] = value
    values["name"] = name
    hints = typing.get_type_hints(Target)
    for key, value in list(values.items()):
        values[key] = _coerce(value, hints[key], f"{where} {key}", (*at, key))
    if "memory_bytes" not in values and values.get("tiles") and values.get("bytes_per_tile"):
        values["memory_bytes"] = values["tiles"] * values["bytes_per_tile"]
    missing = [
        f.name
        for f in fields(Target)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in values
    ]
    if missing:
        raise LocatedError(
            f'{where}: missing key {missing[0]!r} (or set base = "ipu-mk2")', path=at
        )
    try:
        return Target(**values)
    except (TypeError, ValueError) as exc:
        raise LocatedError(f"{where}: {exc}", path=at) from None


def load_table(
    cls: type[T], table: Mapping[str, Any], where: str, *, path: Sequence[str] = ()
) -> T:
    """Build the frozen dataclass ``cls`` from a TOML table; unknown keys are errors naming the key.

    ``path`` is the table's place in the document, for the error's line (a sidecar passes none).
    """
    if not isinstance(table, Mapping):
        raise LocatedError(f"{where}: must be a table", path=path)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in hints:
            raise LocatedError(
                f"{where}: unknown key {key!r} (known: {', '.join(names)})", path=(*path, key)
            )
        kwargs[key] = _coerce(value, hints[key], f"{where} {key}", (*path, key))
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise LocatedError(
            f"{where}: {exc.key} {exc.detail}", path=(*path, *exc.key.split("."))
        ) from None


def _describe(hint: Any) -> str:
    """A type of the schema in words, for an error naming what a key takes."""
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _coerce(value: Any, hint: Any, where: str, path: tuple[str, ...]) -> Any:
    def fail(message: str) -> LocatedError:
        return LocatedError(f"{where}: {message}", path=path)

    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], where, path)
        for kind in inner:  # e.g. ``int | Literal["auto"]``: the first that takes the value
            try:
                return _coerce(value, kind, where, path)
            except LocatedError:
                continue
        raise fail(f"expected {' or '.join(_describe(k) for k in inner)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise fail(f"{value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise fail(f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail(f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise fail(f"expected a string, got {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise fail(f"expected a path string, got {value!r}")
        return Path(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise fail(f"expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], where, path) for v in value)
    if origin is Mapping or origin is dict:
        if not isinstance(value, Mapping):
            raise fail(f"expected a table, got {value!r}")
        return {
            str(k): _coerce(v, args[1], f"{where}.{k}", (*path, str(k))) for k, v in value.items()
        }
    raise TypeError(f"unsupported config type {hint!r}")  # pragma: no cover - a programming error
