"""One validated, frozen configuration object from ``sharderd.toml``.

``schema`` holds the sections as frozen dataclasses, ``load`` parses and validates a file (unknown
keys are errors naming the key and its line, found by ``positions``), ``reference`` turns the schema
into docs/config.md's reference and the shipped ``sharderd.toml``, and ``options`` resolves a job's
effective search options from flags, sidecar and config, once.
"""

from __future__ import annotations

from sharderd.config.load import config_from_dict, load_config, load_table, parse_toml
from sharderd.config.options import SearchOptions, amend_plan, search_options
from sharderd.config.reference import describe_config
from sharderd.config.schema import (
    ClusterConfig,
    Config,
    DaemonConfig,
    OrtConfig,
    PlanConfig,
    PoprtConfig,
    SearchConfig,
)

__all__ = [
    "ClusterConfig",
    "Config",
    "DaemonConfig",
    "OrtConfig",
    "PlanConfig",
    "PoprtConfig",
    "SearchConfig",
    "SearchOptions",
    "amend_plan",
    "config_from_dict",
    "describe_config",
    "load_config",
    "load_table",
    "parse_toml",
    "search_options",
]
