"""The parameter planner: a metric's settings and an expected number of reports in, its
privacy cost, the standard error of a share (or a mean) and the smallest share it can
detect out.

The settings go through the registry's own parser (:func:`~veil.shared.kinds.parse_params`,
so ``oracle = "auto"`` chooses as a registry would and says why), the privacy cost is the
parameters' own ``epsilon_1`` and ``epsilon_inf``, and the variances are the ones the
decoders state: a frequency oracle's ``share_variance``, a RAPPOR bit's
``rho (1 - rho) / (N (q* - p*)^2)`` at ``rho = p*`` (a lone string averages its ``h``
bits), randomized response's ``y0 (1 - y0) / (N (y1 - y0)^2)``, and a number's added noise
plus the largest spread of values in its range. The detection limit uses the string
decoder's rule: the critical z of the multiple-testing correction plus the z of 80% power.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from veil.server.dashboard.state import count
from veil.shared.errors import ParameterError
from veil.shared.kinds import MechanismParams, parse_params
from veil.shared.kinds.oracles.base import MAX_ORACLE_CATEGORIES

#: the form's fields: name -> (label, help); every one is optional but ``kind``
FIELDS = {
    "kind": ("Kind", "string, category, boolean or number"),
    "oracle": ("Oracle", "category: auto, rappor, grr, oue, olh or hadamard"),
    "epsilon": ("Epsilon", "privacy per value (category oracles, numbers, strings)"),
    "categories": ("Categories", "category: how many values"),
    "values": ("Distinct values", "string: how many strings the population holds"),
    "k": ("k (Bloom bits)", "string"),
    "h": ("h (hashes)", "string"),
    "m": ("m (cohorts)", "string"),
    "p": ("p", "string: P(IRR = 1 | PRR = 0)"),
    "q": ("q", "string: P(IRR = 1 | PRR = 1)"),
    "f": ("f", "string: permanent randomization"),
    "alpha": ("alpha", "boolean: share answering truthfully"),
    "mechanism": ("Mechanism", "number: laplace, gaussian or 1bitmean"),
    "low": ("Low", "number: smallest value"),
    "high": ("High", "number: largest value"),
    "reports": ("Reports", "expected reports over the range you will decode"),
}
DEFAULTS = {"kind": "category", "oracle": "auto", "epsilon": "2", "categories": "10",
            "reports": "100000"}
#: distinct strings assumed when the form gives none
DEFAULT_STRING_VALUES = 1000
_INTEGERS = ("k", "h", "m")
#: the settings that make a string metric Bloom RAPPOR (the others are FLH's and HCMS's)
RAPPOR_FIELDS = frozenset({"k", "h", "m", "p", "q", "f"})
_NUMBERS = ("epsilon", "p", "q", "f", "alpha", "low", "high")


def _number(value: str, field: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ParameterError(field, f"{field} must be a number; got {value!r}") from None
    if not math.isfinite(number):
        raise ParameterError(field, f"{field} must be a finite number; got {value!r}")
    return number




def settings_of(form: Mapping[str, str]) -> tuple[dict[str, Any], int, int]:
    """The registry settings the form describes, the expected reports and the number of
    distinct values; :class:`ParameterError` naming a bad field."""
    given = {key: str(form.get(key, "")).strip() for key in FIELDS}
    given = {key: value for key, value in given.items() if value}
    kind = given.get("kind", DEFAULTS["kind"])
    settings: dict[str, Any] = {"kind": kind}
    for key in _INTEGERS:
        if key in given:
            settings[key] = count(given[key], key)
    for key in _NUMBERS:
        if key in given:
            settings[key] = _number(given[key], key)
    if "mechanism" in given:
        settings["mechanism"] = given["mechanism"]
    values = 2
    if kind == "category":
        values = count(given.get("categories", DEFAULTS["categories"]), "categories", 2,
                        MAX_ORACLE_CATEGORIES)
        settings["categories"] = [f"value {i + 1}" for i in range(values)]
        if "oracle" in given:
            settings["oracle"] = given["oracle"]
    elif kind == "string":
        values = count(given.get("values", str(DEFAULT_STRING_VALUES)), "values")
        if RAPPOR_FIELDS & set(given):
            # Bloom RAPPOR's own parameters: the form's default epsilon and oracle (the
            # string oracles') are not its settings
            settings.pop("epsilon", None)
        elif "oracle" in given:
            settings["oracle"] = given["oracle"]
    reports = count(given.get("reports", DEFAULTS["reports"]), "reports")
    return settings, reports, values


def share_std_error(params: MechanismParams, reports: int) -> tuple[float, str]:
    """The standard error of a share near 0 (of a mean, for numbers) from ``reports``
    reports, and what it is the standard error of. Each kind's parameters say which variance
    applies by what they offer."""
    params_: Any = params  # read by what it offers, not by its class
    if hasattr(params_, "share_variance"):
        return math.sqrt(params_.share_variance(0.0, reports)), "a share near 0"
    if hasattr(params_, "yes_probs"):
        y0, y1 = params_.yes_probs
        return math.sqrt(y0 * (1 - y0) / (reports * (y1 - y0) ** 2)), "the share answering true"
    if hasattr(params_, "noise_variance"):
        spread = ((params_.high - params_.low) / 2) ** 2
        return math.sqrt((params_.noise_variance() + spread) / reports), "the mean (at most)"
    rappor = params_.as_rappor()
    p_star, q_star = rappor.effective_probs
    variance = p_star * (1 - p_star) / (reports * rappor.h * (q_star - p_star) ** 2)
    return math.sqrt(variance), "a lone value's share" if rappor.h > 1 else "a share near 0"


def plan(form: Mapping[str, str]) -> dict[str, Any]:
    """What the planner shows for ``form``: the parameters, their privacy cost, the
    standard error and the detection limit (see the module docstring)."""
    from veil.server.analysis.decoders import DEFAULT_OPTIONS
    from veil.server.analysis.stats import detection_z
    from veil.server.analysis.string_summary import DETECTION_POWER

    settings, reports, values = settings_of(form)
    params, note = parse_params(settings)
    std_error, of_what = share_std_error(params, reports)
    z_detect = detection_z(DEFAULT_OPTIONS.alpha, DEFAULT_OPTIONS.correction, values,
                           DETECTION_POWER)
    mean = hasattr(params, "noise_variance")
    return {
        "mechanism": params.mechanism_name,
        "note": note,
        "params": {key: value for key, value in params.to_dict().items()
                   if key != "categories" and value is not None},
        "epsilon_1": params.epsilon_1,
        "epsilon_inf": params.epsilon_inf,
        "reports": reports,
        "values": values,
        "std_error": std_error,
        "std_error_of": of_what,
        "interval_95": 1.959964 * std_error,
        "min_detectable_share": None if mean else min(z_detect * std_error, 1.0),
        "alpha": DEFAULT_OPTIONS.alpha, "correction": DEFAULT_OPTIONS.correction,
        "detection_power": DETECTION_POWER,
    }
