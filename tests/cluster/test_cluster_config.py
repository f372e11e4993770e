"""``[cluster]``: validated like every section; the default (local) changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharderd.config import ClusterConfig, Config, load_config
from sharderd.errors import ConfigError


def _load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "sharderd.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def test_default_is_local_and_needs_no_ray() -> None:
    assert ClusterConfig().engine == "local"
    assert load_config(None).cluster == ClusterConfig()


def test_a_ray_section_loads(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        '[cluster]\nengine = "ray"\naddress = "10.0.0.1:6379"\nshared_dir = "/srv/s"\n'
        'sdk_resource = "poplar_sdk"\nmemory_bytes = 1024\nenv_passthrough = ["POPLAR_ENGINE_OPTIONS"]\n',
    )
    assert config.cluster.engine == "ray" and config.cluster.shared_dir == Path("/srv/s")
    assert config.cluster.env_passthrough == ("POPLAR_ENGINE_OPTIONS",)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[cluster]\nengin = "ray"\n', "'engin'"),
        ('[cluster]\nengine = "slurm"\n', "'slurm'"),
        ('[cluster]\nengine = "ray"\n', "shared_dir"),
        ("[cluster]\nschedule_timeout = 0\n", "schedule_timeout"),
        ("[cluster]\nnum_cpus = -1\n", "num_cpus"),
    ],
)
def test_bad_cluster_keys_are_errors_naming_them(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert named in str(err.value)
