"""Sizes and parameters of ``veil demo`` (light: imported by ``veil --help``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from veil.shared.kinds import BooleanParams, JointParams, NumberParams, StringParams
from veil.shared.registry import Metric, Registry

#: the most installations a demo runs: each is a real client with its own state directory
#: (a few hundred a second); ``veil populate`` fills a collector with more
MAX_INSTALLATIONS = 100_000
#: the session lengths (minutes) the joint metric ``dark_by_session`` buckets
SESSION_BUCKETS = (0.0, 15.0, 30.0, 60.0, 120.0)


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Sizes and parameters of one demo run."""

    installations: int = 2000
    sites_per_installation: int = 4
    workers: int = 4
    k: int = 64
    h: int = 2
    m: int = 16
    p: float = 0.25
    q: float = 0.75
    f: float = 0.5
    seed: int = 2026
    out: Path = Path("veil-demo")
    temp_root: Path | None = None

    def minimum_installations(self) -> int:
        """The fewest installations whose reports reach every metric's ``min_reports`` (the
        string metric gets :attr:`sites_per_installation` reports an installation, the
        others one)."""
        return max(-(-metric.min_reports // (self.sites_per_installation
                                             if metric.name == "homepage" else 1))
                   for metric in self.registry().values())

    def registry(self) -> Registry:
        """The metrics the simulated installations report."""
        return Registry([
            Metric("homepage", StringParams(k=self.k, h=self.h, m=self.m, p=self.p, q=self.q,
                                            f=self.f),
                   description="sites visited (4 distinct per installation)", min_reports=100),
            Metric("dark_mode", BooleanParams(), description="dark mode enabled", min_reports=100),
            Metric("session_minutes", NumberParams(low=0, high=120, mechanism="laplace",
                                                   epsilon=1.0, resolution=120),
                   description="length of the last session", min_reports=100),
            Metric("dark_by_session",
                   JointParams(of=("session_minutes", "dark_mode"),
                               domains=(SESSION_BUCKETS, "boolean"), epsilon=2.0,
                               report_epsilon=2.0),
                   description="dark mode by session length, reported together",
                   min_reports=100),
        ])
