"""The privacy, planner and operations pages (see :mod:`veil.server.dashboard.pages`)."""

from __future__ import annotations

from collections.abc import Mapping

from veil.server.analysis.cost import privacy_cost
from veil.server.dashboard import planner
from veil.server.dashboard.decodes import Decodes
from veil.server.dashboard.model import Chart, Page, Table
from veil.server.dashboard.state import PageState
from veil.shared.errors import ParameterError
from veil.shared.registry import Metric


def privacy_page(decodes: Decodes, state: PageState) -> Page:
    """Per metric: epsilon for one report, for one value however often reported, and an
    installation's worst case (every possible value reported; none for open sets such as
    strings); and the totals for an installation that reports everything."""
    registry = decodes.source.registry()
    rows = []
    bounded: dict[str, float] = {}
    for name, metric in registry.items():
        # the parameters alone set the cost: the page never depends on what was reported
        cost = {} if metric.of else privacy_cost(metric.params, *metric.params.possible_values)
        worst = cost.get("epsilon_per_installation")
        if worst is not None:
            bounded[name] = worst
        rows.append({"metric": name, "mechanism": metric.params.mechanism_name,
                     "epsilon_1": metric.params.epsilon_1,
                     "epsilon_inf": metric.params.epsilon_inf,
                     "distinct_values": cost.get("distinct_values"),
                     "epsilon_installation": worst,
                     "statement": cost.get("statement") or _statement(metric)})
    page = Page("privacy", "Privacy", [Table("privacy", "Privacy cost per metric", {
        "metric": "Metric", "mechanism": "Mechanism", "epsilon_1": "ε one report",
        "epsilon_inf": "ε one value", "distinct_values": "Possible values",
        "epsilon_installation": "ε worst case per installation", "statement": "Statement",
    }, rows)])
    one_each = registry.epsilon_total()
    page.facts = {"ε for one value of every metric": one_each}
    if len(bounded) == len(rows):
        page.facts["ε worst case, every value of every metric"] = registry.epsilon_total(bounded)
    else:
        unbounded = [str(row["metric"]) for row in rows if row["metric"] not in bounded]
        open_sets = f"{', '.join(unbounded)} {'has' if len(unbounded) == 1 else 'have'}"
        page.facts["ε worst case, every value of every metric"] = "no bound"
        page.notes.append(f"No worst case bounds every metric: {open_sets} no upper limit "
                          "on the distinct values an installation reports (n values cost n × ε "
                          "one value).")
    page.notes.append("Sequential composition: the epsilons of the values one installation "
                      "reports add up; a string metric and its discovery channel count once "
                      "(an installation reports through one of them).")
    return page


def _statement(metric: Metric) -> str:
    """What a discovery channel costs, in words (it shares its string metric's values)."""
    return (f"a channel of {metric.of}: each installation reports through it or through "
            f"{metric.of}, never both; n distinct strings cost n × ε one value")


def planner_page(form: Mapping[str, str]) -> Page:
    """The planner's form result: privacy cost, standard error and detection limit of the
    parameters the form describes, or the field that is wrong."""
    values = {**planner.DEFAULTS, **{key: form[key] for key in planner.FIELDS if key in form}}
    page = Page("planner", "Planner")
    page.facts = {"form": values}
    try:
        result = planner.plan(values)
    except ParameterError as exc:
        page.notes.append(f"{exc.field}: {exc.message}")
        page.facts["error_field"] = exc.field
        return page
    rows = [
        {"quantity": "Mechanism", "value": result["mechanism"]},
        {"quantity": "ε one report", "value": result["epsilon_1"]},
        {"quantity": "ε one value (all its reports)", "value": result["epsilon_inf"]},
        {"quantity": "Expected reports", "value": result["reports"]},
        {"quantity": f"Standard error of {result['std_error_of']}", "value": result["std_error"]},
        {"quantity": "95% interval half-width", "value": result["interval_95"]},
    ]
    if result["min_detectable_share"] is not None:
        rows.append({"quantity": f"Smallest detectable share (of {result['values']} values, "
                                 f"{result['correction']} at {result['alpha']}, "
                                 f"{result['detection_power']:.0%} power)",
                     "value": result["min_detectable_share"]})
    page.tables.append(Table("plan", "What these parameters give",
                             {"quantity": "Quantity", "value": "Value"}, rows))
    page.tables.append(Table("params", "Parameters", {"name": "Parameter", "value": "Value"},
                             [{"name": key, "value": value}
                              for key, value in result["params"].items()]))
    if result["note"]:
        page.notes.append(result["note"])
    return page


def operations_page(decodes: Decodes, state: PageState) -> Page:
    """Reports per day per metric, refused reports by reason (the collector's counters),
    store size and readiness."""
    source = decodes.source
    daily = source.daily_reports(state.start, state.end)
    registry = source.registry()
    rows = [{"metric": name, "day": day, "reports": daily.get(name, {}).get(day, 0)}
            for name in registry for day in state.days]
    ready, why = source.readiness()
    page = Page("operations", "Operations", [Table(
        "daily", "Reports per day per metric", {"metric": "Metric", "day": "Day",
                                                "reports": "Reports"}, rows)],
        [Chart("daily", "Reports per day", "daily", "lines", "day", "reports", "reports",
               series="metric")])
    page.facts = {"Source": source.name, "Ready": "yes" if ready else "no", "Readiness": why,
                  "Store bytes": source.store_bytes(),
                  "Reports in range": sum(row["reports"] for row in rows)}
    refusals = source.refusals()
    if refusals is None:
        page.notes.append("Refused reports are counted by the collector, not the store: see "
                          "its GET /metrics (Prometheus), the source for alerting.")
    else:
        page.tables.append(Table("refusals", "Refused since the collector started",
                                 {"counter": "Counter", "code": "Reason", "count": "Count"},
                                 [row for row in refusals if row["count"]],
                                 caption="Reasons with no refusal are left out."))
    return page
