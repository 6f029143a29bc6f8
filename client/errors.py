"""Errors the client SDK raises on purpose (all :class:`~veil.shared.errors.VeilError`).

Encoders raise :class:`~veil.shared.errors.ParameterError` (field ``value``) for a
value of the wrong type or outside a category list; the classes here cover the
rest of the public surface.
"""

from __future__ import annotations

from veil.shared.errors import ParameterError, VeilError, type_name

#: the most characters of a metric name that messages show
SHOWN_NAME = 100


def shown_metric(metric: object) -> str:
    """A metric name as the application gave it, for a message: quoted (``'homepage'``; cut
    after :data:`SHOWN_NAME` characters), or for a name that is no string its type in angle
    brackets (``<int>``). It calls no method of ``metric``, so it never fails."""
    if not isinstance(metric, str):
        return f"<{type_name(metric)}>"
    text = str.__repr__(str.__getitem__(metric, slice(0, SHOWN_NAME)))
    return text if str.__len__(metric) <= SHOWN_NAME else f"{text}..."


class UnknownMetricError(ParameterError, KeyError):
    """``report()`` named a metric the registry does not define (or, with ``message``, one
    it may not report to)."""

    def __init__(self, metric: object, known: list[str], message: str | None = None) -> None:
        shown = ", ".join(sorted(known)) or "none"
        super().__init__(
            "metric",
            message or f"unknown metric {shown_metric(metric)}; the registry defines: {shown}. "
                       "Add it to the collector's registry or fix the name.",
        )
        self.metric = metric

    def __str__(self) -> str:
        return self.message


class BudgetExceededError(VeilError):
    """A report would push what the budget is charged (``privacy_spent().charged``: the worst
    case over every value the installation's reports could carry) over the budget."""

    def __init__(
        self, metric: str, spent: float, would_be: float, budget: float, note: str = ""
    ) -> None:
        super().__init__(
            f"reporting to {metric!r} would raise what this installation's budget is charged "
            f"(the worst case over the values its reports could carry) from {spent:.6g} to "
            f"{would_be:.6g}, over its budget of {budget:.6g}; "
            f"nothing was queued{note}"
        )
        self.metric = metric
        self.spent = spent
        self.would_be = would_be
        self.budget = budget


class RegistryUnavailableError(VeilError):
    """No metric registry: the collector could not be reached and nothing is cached.

    ``unreachable`` says that the collector did not answer (a network error, a
    timeout, or a 408, 429 or 5xx answer): part of an outage. An answer that is
    no registry (a 404, a malformed document) is not.
    """

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class StateError(VeilError):
    """The state directory cannot be used (permissions, a damaged secret file, ...)."""


class ClientClosedError(VeilError):
    """The client was used after :meth:`~veil.client.Client.close`."""


__all__ = [
    "BudgetExceededError",
    "ClientClosedError",
    "ParameterError",
    "RegistryUnavailableError",
    "StateError",
    "UnknownMetricError",
    "VeilError",
]
