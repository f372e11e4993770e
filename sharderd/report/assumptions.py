"""The model dims sharderd filled from a default rather than from anything the user gave.

The IPU compiles static shapes, and sharderd never plans on a guessed size, with one exception it
owns: a symbolic *leading* dim that neither ``input_shapes`` nor ``dims`` sets takes
``plan.batch_size``, which is 1 unless someone gives it. When nobody did, every dim so filled is
said (report.json ``warnings``, a ``warning:`` line of the CLI, a Python warning), naming the input,
the axis and the setting that states the size.

The inputs are read as report.json's ``model.inputs`` lists them: the file's own dims, an ``int``
for a static one, the ``dim_param`` (``"?"`` when anonymous) for a symbolic one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sharderd.config import Config

__all__ = ["defaulted_dims"]

_ANONYMOUS = ("?", "-1", -1)


def defaulted_dims(inputs: Sequence[Mapping[str, Any]], config: Config) -> list[str]:
    """One warning per symbolic dim name (or anonymous leading dim) filled from the default
    ``batch_size``; none when ``batch_size`` was given."""
    plan = config.plan
    if "batch_size" in config.plan_given:
        return []
    shaped = {i["name"] for i in inputs if i["name"] in plan.input_shapes}
    from_shapes = {
        dim for i in inputs if i["name"] in shaped for dim in i["shape"] if isinstance(dim, str)
    }
    open_inputs = [i for i in inputs if i["name"] not in shaped and i["shape"]]
    batch = plan.batch_size
    defaulted: dict[str, list[tuple[str, int]]] = {}
    for value in open_inputs:
        lead = value["shape"][0]
        if lead in _ANONYMOUS:
            defaulted.setdefault(f"#{value['name']}", []).append((value["name"], 0))
        elif isinstance(lead, str) and lead not in plan.dims and lead not in from_shapes:
            defaulted.setdefault(lead, [])
    for value in open_inputs:
        for axis, dim in enumerate(value["shape"]):
            if isinstance(dim, str) and dim in defaulted and not dim.startswith("#"):
                defaulted[dim].append((value["name"], axis))
    return [_warning(name, where, batch) for name, where in defaulted.items()]


def _warning(name: str, where: Sequence[tuple[str, int]], batch: int) -> str:
    places = ", ".join(f"input {i!r} axis {axis}" for i, axis in where)
    what = "an anonymous dim" if name.startswith("#") else f"dim {name!r}"
    return (
        f"{what} ({places}) was given no value and is planned as {batch}, the default batch_size: "
        f"say so with `--batch-size {batch}` (Python: batch_size={batch}; sharderd.toml [plan] or a "
        f"daemon sidecar: batch_size = {batch}), or give the size to compile for"
    )
