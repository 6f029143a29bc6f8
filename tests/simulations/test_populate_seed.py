"""``veil populate`` run twice adds two samples of installations, not one twice: the
population's seed is fresh on each run and printed, and ``--seed`` draws it again."""

from __future__ import annotations

import re

from veil.server.cli import main
from veil.shared.registry import Registry

REGISTRY = Registry.from_toml("""
version = 1

[metrics.load_seconds]
kind = "number"
low = 0
high = 10
mechanism = "laplace"
epsilon = 1.0
""")


def populate(collector, capsys, *extra: str) -> tuple[str, str]:
    """Run ``veil populate``; its printed seed (or "") and truth line."""
    assert main(["populate", "--server", collector.url, "--installations", "200", *extra]) == 0
    printed = capsys.readouterr().out
    seed = re.search(r"population seed (\d+) \(--seed \1 draws", printed)
    truth = re.search(r"load_seconds: 200 reports accepted; truth: (.*)", printed)
    assert truth, printed
    return (seed.group(1) if seed else ""), truth.group(1)


def test_each_run_draws_new_installations_and_says_how_to_draw_them_again(
        collector_factory, capsys) -> None:
    collector = collector_factory(REGISTRY)
    first_seed, first = populate(collector, capsys)
    second_seed, second = populate(collector, capsys)
    assert first_seed and second_seed and first_seed != second_seed
    assert first != second  # the true means of two samples of 200 numbers
    again_seed, again = populate(collector, capsys, "--seed", first_seed)
    assert again_seed == "" and again == first
    assert collector.counts("load_seconds")["reports"] == 600
