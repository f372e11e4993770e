"""The documents that describe behaviour agree with the code."""

from __future__ import annotations

import re
from pathlib import Path

from sharderd.config import load_config
from sharderd.config.reference import default_toml, field_docs, reference_markdown

REPO = Path(__file__).resolve().parent.parent


def test_config_reference_is_generated_from_the_schema() -> None:
    """docs/config.md's reference equals what the schema generates (regenerate it when fields change)."""
    reference = (REPO / "docs" / "config.md").read_text()
    assert reference_markdown() in reference


def test_shipped_sharderd_toml_lists_every_default() -> None:
    """sharderd.toml is the generated default file and loads back to the default config."""
    assert (REPO / "sharderd.toml").read_text() == default_toml()
    assert load_config(REPO / "sharderd.toml").daemon == load_config(None).daemon


def test_every_config_field_is_documented() -> None:
    """Each key of every section carries a docstring, so the reference has no blank meaning."""
    from dataclasses import fields

    from sharderd.config.schema import SECTIONS
    from sharderd.target import Target

    for cls in [*SECTIONS.values(), Target]:
        docs = field_docs(cls)
        assert [f.name for f in fields(cls) if f.name not in docs] == []


def test_readme_starts_with_the_two_commands_ci_runs() -> None:
    """The second README command is exactly what .ci/run runs."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)\n```", readme, re.S)
    assert block is not None
    install_run, tests = (line for line in block.group(1).splitlines() if not line.startswith("#"))
    assert "sharderd example-model" in install_run and "sharderd shard" in install_run
    assert tests in (REPO / ".ci" / "run").read_text()
