"""The application's own privacy limits, checked against the collector's registry.

Veil protects people against the collector, yet the collector serves the
parameters every report is encoded with: a collector that serves
``epsilon = 50``, ``alpha = 0.9999999`` or ``f = 0`` (``epsilon_inf = inf``)
would otherwise be obeyed. So the application states what it accepts, and
:meth:`PrivacyLimits.refusals` names every metric of a registry that breaks it,
before any report is encoded; the client never encodes those metrics.

* ``max_epsilon_per_value`` caps ``epsilon_inf``, what any number of reports of
  one value may reveal. The default, :data:`DEFAULT_MAX_EPSILON_PER_VALUE`, is
  far above every kind's default parameters (at most ``4 ln 3 = 4.39``) and
  google/rappor's typical ones (4.95), and refuses the clearly hostile.
* ``max_epsilon_per_report`` caps ``epsilon_1``, what one report may reveal
  (no cap by default: ``epsilon_inf`` bounds one report too).
* ``pinned`` maps metric names to the parameter fingerprint
  (``MechanismParams.fingerprint``) the application was built and reviewed
  with: any other parameters for that metric are refused. The discovery channel of a
  pinned string metric (``homepage.discovery``, through which some installations
  report ``homepage``) is refused unless it is pinned too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from veil.shared.registry import Metric, Registry

#: the default cap of ``epsilon_inf`` (a likelihood ratio of e**10, about 22,000)
DEFAULT_MAX_EPSILON_PER_VALUE = 10.0

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


def valid_pins(value: Any) -> bool:
    """Whether ``value`` maps metric names to parameter fingerprints (16 lowercase hex digits):
    the client's ``pinned`` argument (checked with the others in :mod:`veil.client.options`)."""
    return isinstance(value, Mapping) and all(
        isinstance(name, str) and isinstance(fp, str) and _FINGERPRINT.fullmatch(fp) is not None
        for name, fp in value.items()
    )


@dataclasses.dataclass(frozen=True)
class PrivacyLimits:
    """What the application accepts from a collector's registry (see the module docstring)."""

    max_epsilon_per_report: float | None = None
    max_epsilon_per_value: float | None = DEFAULT_MAX_EPSILON_PER_VALUE
    pinned: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def refusal(self, metric: Metric) -> str | None:
        """Why ``metric`` breaks these limits (naming it, its value and the limit), or ``None``."""
        params = metric.params
        pin = self.pinned.get(metric.name)
        if pin is not None and params.fingerprint != pin:
            return (
                f"metric {metric.name!r} is refused: the registry gives it the parameters with "
                f"fingerprint {params.fingerprint} (epsilon_1 = {params.epsilon_1:.6g}, "
                f"epsilon_inf = {params.epsilon_inf:.6g}), but this application pinned "
                f"{pin}; its reports are never encoded. Review the new parameters and update "
                "pinned"
            )
        if pin is None and metric.of and metric.of in self.pinned:
            return (
                f"metric {metric.name!r} is refused: it is the discovery channel of "
                f"{metric.of!r}, which this application pinned, and its parameters "
                f"(fingerprint {params.fingerprint}) are not pinned; the reports of "
                f"{metric.of!r} this installation would send through it are never encoded. "
                f"Review them and pin {metric.name!r} too"
            )
        for quantity, value, limit, name in (
            ("epsilon_inf", params.epsilon_inf, self.max_epsilon_per_value,
             "max_epsilon_per_value"),
            ("epsilon_1", params.epsilon_1, self.max_epsilon_per_report, "max_epsilon_per_report"),
        ):
            if limit is not None and not value <= limit:
                shown = "inf (no bound)" if math.isinf(value) else f"{value:.6g}"
                return (
                    f"metric {metric.name!r} is refused: its {quantity} is {shown}, above this "
                    f"application's limit {name} = {limit:g}; its reports are never encoded. "
                    f"Ask the collector's operators for stronger parameters, or raise {name}"
                )
        return None

    def refusals(self, registry: Registry) -> dict[str, str]:
        """Every metric of ``registry`` these limits refuse, with why."""
        found = {metric.name: self.refusal(metric) for metric in registry.values()}
        return {name: why for name, why in found.items() if why is not None}
