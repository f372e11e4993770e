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


def test_planning_md_states_the_exact_dps_limits_as_the_code_has_them() -> None:
    """docs/planning.md's sentence on the bit-mask DP, its numbers computed from the constants: the
    largest N whose every DAG is within the ideal and pair limits, and the tensors that keep the
    worst of them (the antichain) within the work limit."""
    from sharderd.plan.ideals import MAX_IDEALS, MAX_NODES, MAX_PAIRS, MAX_WORK

    n = max(k for k in range(1, MAX_NODES + 1) if 2**k <= MAX_IDEALS and 3**k - 2**k <= MAX_PAIRS)
    pairs = 3**n - 2**n
    tensors = MAX_WORK // (pairs * n)
    chains = 15
    chain_pairs = ((chains + 1) * (chains + 2) // 2) ** 3 - (chains + 1) ** 3
    expected = (
        f"at most {MAX_NODES} nodes (`MAX_NODES`), {MAX_IDEALS:,} ideals (`MAX_IDEALS`), "
        f"{MAX_PAIRS:,} nested pairs `I ⊂ J` (`MAX_PAIRS`) and {MAX_WORK:,} pair × node × tensor "
        f"steps (`MAX_WORK`). Every DAG of up to {n} nodes is within the first three (at most "
        f"2^{n} ideals and 3^{n} − 2^{n} = {pairs:,} pairs, the antichain's), and is solved exactly "
        f"when it has at most {tensors} tensors (graph inputs read and outputs made): "
        f"{n} independent three-input `Sum` nodes have {n * 4} and are not. Three independent "
        f"chains of {chains} nodes ({3 * chains} nodes, {(chains + 1) ** 3:,} ideals) are not "
        f"either: {chain_pairs:,} pairs."
    )
    text = " ".join((REPO / "docs" / "planning.md").read_text().split())
    assert expected in text
    assert (chains + 1) ** 3 <= MAX_IDEALS and chain_pairs > MAX_PAIRS and tensors < n * 4


def test_planning_md_states_the_group_dps_limits_as_the_code_has_them() -> None:
    from sharderd.plan import group_ideals as g

    text = " ".join((REPO / "docs" / "planning.md").read_text().split())
    budget = g.MAX_EXACT_WORK // (5_000 + 5_000)
    assert (
        f"Limits: {g.MAX_GROUP_IDEALS:,} ideals, {g.MAX_CONTAINMENT_WORDS:,} containment words, "
        f"{g.MAX_PAIRS:,} pairs, exact memory measurements worth {g.MAX_EXACT_WORK:,} node + edge "
        f"steps (each measurement costs nodes + edges: {budget:,} measurements on a graph of 5,000 "
        "nodes and 5,000 edges, at least 50 on any graph)"
    ) in text
