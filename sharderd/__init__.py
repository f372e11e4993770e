"""sharderd: plan, annotate and prove pipeline sharding of ONNX models.

The Python API (docs/python.md)::

    import sharderd

    plan = sharderd.plan("model.onnx", devices=4)
    result = sharderd.shard("model.onnx", devices=4, out="model.sharded", backend="onnxruntime")

Importing ``sharderd`` loads no onnx, numpy or engine module; the first call does.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Two subpackages share the functions' names, ``plan`` and ``shard``. Python binds a subpackage
# onto its parent when the subpackage is first imported, so both are imported here (their
# ``__init__`` modules are empty), before the functions are bound: afterwards ``sharderd.plan`` and
# ``sharderd.shard`` stay the functions, and ``from sharderd.plan.types import ...`` keeps working
# (it finds the subpackage in ``sys.modules``).
for _subpackage in ("sharderd.plan", "sharderd.shard"):
    importlib.import_module(_subpackage)
del _subpackage

from sharderd.api import load_config, plan, shard, shard_async, targets  # noqa: E402
from sharderd.config import Config  # noqa: E402
from sharderd.errors import (  # noqa: E402
    BackendUnavailableError,
    CompileFailedError,
    ConfigError,
    DimsUnresolvedError,
    ModelInvalidError,
    NoSplitError,
    NotProvenError,
    OutputWriteError,
    PlanInfeasibleError,
    SharderdError,
    VerificationError,
)
from sharderd.results import Attempt, Plan, ShardResult, Stage, Verification  # noqa: E402
from sharderd.target import Target  # noqa: E402

__all__ = [  # noqa: RUF022 (grouped by purpose, not sorted)
    # what sharderd does
    "plan",
    "shard",
    "shard_async",
    # what it returns
    "Attempt",
    "Plan",
    "ShardResult",
    "Stage",
    "Verification",
    # what it is told
    "Config",
    "Target",
    "load_config",
    "targets",
    # how it fails: every error is a SharderdError; ``exit_code`` is the CLI's for it
    "BackendUnavailableError",
    "CompileFailedError",
    "ConfigError",
    "DimsUnresolvedError",
    "ModelInvalidError",
    "NoSplitError",
    "NotProvenError",
    "OutputWriteError",
    "PlanInfeasibleError",
    "SharderdError",
    "VerificationError",
    # the package
    "__version__",
]
