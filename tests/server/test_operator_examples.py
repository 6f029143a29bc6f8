"""examples/: the registry covers every kind and mechanism, and its privacy comments are true."""

from __future__ import annotations

import re
from pathlib import Path

from veil.server.analysis.candidate_map import read_candidates
from veil.server.collector.starter import METRICS_TOML
from veil.shared.kinds import MECHANISMS, NumberParams
from veil.shared.kinds.number import NUMBER_MECHANISMS
from veil.shared.registry import Registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REGISTRY = EXAMPLES / "metrics.toml"
FIGURE = r"([0-9]+(?:\.[0-9]+)?)"


def figure(value: float) -> str:
    """How the comments (and ``veil metrics``) write an epsilon."""
    return f"{value:.4g}"


def comments_before_tables(text: str) -> dict[str, str]:
    """Each metric's name and the comment block just above its ``[metrics.NAME]`` line."""
    blocks: dict[str, str] = {}
    comment: list[str] = []
    for line in text.splitlines():
        header = re.fullmatch(r"\[metrics\.([a-z0-9_.-]+)\]", line.strip())
        if header:
            blocks[header.group(1)] = "\n".join(comment)
        comment = [*comment, line] if line.startswith("#") else []
    return blocks


def test_the_example_registry_covers_every_kind_and_mechanism():
    registry = Registry.load(REGISTRY)
    assert {metric.params.mechanism_name for metric in registry.values()} == set(MECHANISMS)
    numbers = {m.params.mechanism for m in registry.values() if isinstance(m.params, NumberParams)}
    assert numbers == set(NUMBER_MECHANISMS)
    assert any(metric.note.startswith("auto chose") for metric in registry.values())
    text = REGISTRY.read_text(encoding="utf-8")
    assert re.search(r'^hashing = "mmh3"\s+#.*"md5-google"', text, re.MULTILINE)


def test_every_privacy_comment_states_what_the_code_computes():
    registry = Registry.load(REGISTRY)
    text = REGISTRY.read_text(encoding="utf-8")
    blocks = comments_before_tables(text)
    assert set(blocks) == set(registry)
    for name, metric in registry.items():
        block = blocks[name]
        stated = re.search(rf"# privacy: epsilon_1 = {FIGURE} per report; "
                           rf"epsilon_inf = {FIGURE} per distinct value\.", block)
        assert stated, f"{name}: no privacy line above its table"
        assert stated.groups() == (figure(metric.params.epsilon_1),
                                   figure(metric.params.epsilon_inf)), name
        for multiple in re.findall(rf"[0-9]+ x {FIGURE}", block):
            assert multiple == figure(metric.params.epsilon_inf), name
    total = re.search(rf"epsilon_total = {FIGURE}\.", text)
    assert total and total.group(1) == figure(registry.epsilon_total())


def test_the_auto_comment_names_the_oracle_auto_chooses():
    registry = Registry.load(REGISTRY)
    blocks = comments_before_tables(REGISTRY.read_text(encoding="utf-8"))
    for name, metric in registry.items():
        if metric.note.startswith("auto chose"):
            assert f"(here: {metric.params.oracle})" in blocks[name]


def test_veil_init_writes_the_example_registry():
    assert REGISTRY.read_text(encoding="utf-8") == METRICS_TOML


def test_the_candidates_hold_distinct_strings_for_the_string_metric():
    text = (EXAMPLES / "candidates.txt").read_text(encoding="utf-8")
    candidates = read_candidates(EXAMPLES / "candidates.txt")
    assert len(candidates) == len(text.splitlines()) >= 10
    assert "string" in {metric.kind for metric in Registry.load(REGISTRY).values()}
