"""Joint metrics: two or more variables reported together, as one report of the tuple.

Veil's reports are unlinkable: two metrics of one installation cannot be joined
at the collector, so a question about how two things relate (the crash rate by
browser) needs the pair in one report. A joint metric declares its variables
(``of``) and their domains; the SDK maps a tuple of values to one cell of the
product domain (row-major: the last variable varies fastest) and reports the
cell through a frequency oracle over the cells, the one of lowest variance for
that many cells unless ``encoding`` names one (GRR, OUE, OLH or Hadamard; see
:mod:`veil.shared.kinds.oracles`). The oracle's parameters, statistic, encoder,
simulation and support counts are reused as they are:
:attr:`JointParams.cell_oracle` is an ordinary
:class:`~veil.shared.kinds.oracles.base.OracleParams` whose categories are the
cells' indices, and every face of a joint metric delegates to that oracle's.

A variable's domain is one of:

* a list of strings: a category variable (the value is one of them);
* ``"boolean"``: a yes/no variable (the value is ``True`` or ``False``);
* a list of at least two increasing numbers: a bucketed number, the edges of its
  buckets ``[e0, e1), [e1, e2), ..., [e_{k-1}, e_k]``; a value below ``e0`` or above
  ``e_k`` counts in the first or last bucket (clipped, as number metrics clip).

String variables over an open dictionary are refused (docs/association.md says
what supporting them would cost).

**Marginals** (``marginals = k``, three or more variables; CALM, Zhang et al., CCS
2018): instead of the whole tuple, each installation reports one of the ``C(v, k)``
marginals of ``k`` variables (:attr:`JointParams.marginal_sets`, in the order of
:func:`itertools.combinations`), the one its cohort names: the cohort is the
installation's cohort seed modulo ``C(v, k)`` (derived from its secret, independent
of every value) and goes on the wire, so the collector keeps the cell oracle's
statistic per marginal. The installation still gives the whole tuple; it reports the
cell of the assigned marginal (row-major over that marginal's variables) through
the cell oracle, which is built over the largest marginal's cells, so every payload
is one any marginal can produce. The product domain may then exceed what one oracle
takes; each marginal may not.

Privacy: one report of a cell is the oracle's report of one category, so a joint
metric costs ``epsilon`` per distinct tuple an installation reports (its
``epsilon_inf``) and ``report_epsilon`` per report, as a category metric would. With
marginals, per distinct cell of its assigned marginal: the assignment depends on the
secret alone, so it costs nothing, and tuples that agree on the marginal share one
memoized response.
It is a mechanism of its own, composed sequentially with the single-variable
metrics of the same installation (docs/privacy.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from veil.shared.errors import ParameterError, type_name
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.boolean import BooleanParams, as_boolean
from veil.shared.kinds.category import CategoryList, listed_choices
from veil.shared.kinds.number import real_number
from veil.shared.kinds.oracles import ORACLES, OracleParams, check_report_cap, choose_oracle
from veil.shared.kinds.oracles.base import MAX_ORACLE_CATEGORIES, settle_epsilons

#: the domain of a yes/no variable, and its two values' labels (index 0 is false)
BOOLEAN = "boolean"
BOOLEAN_LABELS = ("false", "true")
#: most variables one joint metric may have
MAX_VARIABLES = 8
#: most values one category variable may list
MAX_VALUES = 4096


@dataclasses.dataclass(frozen=True)
class Variable:
    """One variable of a joint metric: its ``name``, ``form`` (``category``, ``boolean`` or
    ``number``) and the ``labels`` of its values; ``edges`` for a bucketed number."""

    name: str
    form: str
    labels: tuple[str, ...]
    edges: tuple[float, ...] = ()

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        return {label: i for i, label in enumerate(self.labels)}

    def index(self, value: Any) -> int:
        """The position of ``value`` among the variable's values; a :class:`ParameterError`
        naming the variable when the value has the wrong type or lies outside the domain
        (with the value's type, never the value: it may be private, or huge)."""
        if self.form == "boolean":
            answer = as_boolean(value)
            if answer is None:
                raise ParameterError(
                    self.name, f"{self.name} must be True or False; got {type_name(value)}")
            return int(answer)
        if self.form == "number":
            try:
                x = real_number(value)
            except ParameterError as problem:
                raise ParameterError(self.name, f"{self.name} {problem.message}") from None
            return min(max(bisect.bisect_right(self.edges, x) - 1, 0), len(self.labels) - 1)
        position = self._positions.get(value) if isinstance(value, str) else None
        if position is None:
            raise ParameterError(self.name, f"{self.name} " + listed_choices(
                value, self.labels, f"its {len(self.labels)} values"))
        return position


def _edge_label(low: float, high: float, last: bool) -> str:
    return f"[{low:g}, {high:g}{']' if last else ')'}"


def parse_domain(owner: str, where: str, name: str, domain: Any) -> tuple[Any, Variable]:
    """A domain as it is stored (a tuple of strings, ``"boolean"`` or a tuple of float
    edges) and the :class:`Variable` it defines; a :class:`ParameterError` naming ``where``
    otherwise."""
    if domain == BOOLEAN:
        return BOOLEAN, Variable(name, "boolean", BOOLEAN_LABELS)
    if domain == "string":
        raise ParameterError(
            where, f"{owner}: variable {name!r} is a string over an open dictionary, which a "
                   "joint metric does not take; declare it a category over its candidates "
                   "(docs/association.md)")
    values = tuple(domain) if isinstance(domain, list | tuple) else None
    if values and all(isinstance(v, str) for v in values):
        if not 2 <= len(values) <= MAX_VALUES or not all(values) \
                or len(set(values)) != len(values):
            raise ParameterError(
                where, f"{owner}: the values of {name!r} must be 2 to {MAX_VALUES} distinct "
                       f"non-empty strings. Got {domain!r:.200} instead.")
        return values, Variable(name, "category", values)
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        # an integer beyond the float range (TOML's are unbounded) is no finite edge
        edges = tuple(float(v) if abs(v) <= sys.float_info.max else math.inf for v in values)
        if len(edges) < 2 or not all(math.isfinite(e) for e in edges) \
                or any(b <= a for a, b in itertools.pairwise(edges)):
            raise ParameterError(
                where, f"{owner}: the bucket edges of {name!r} must be at least two finite, "
                       f"increasing numbers. Got {domain!r:.200} instead.")
        labels = tuple(_edge_label(a, b, i == len(edges) - 2)
                       for i, (a, b) in enumerate(itertools.pairwise(edges)))
        return edges, Variable(name, "number", labels, edges)
    raise ParameterError(
        where, f"{owner}: the domain of {name!r} must be a list of strings (categories), "
               f"'boolean', or a list of increasing numbers (bucket edges). "
               f"Got {domain!r:.200} instead.")


@dataclasses.dataclass(frozen=True)
class JointParams(MechanismParams):
    """A tuple of variables (``of``, with their ``domains``) reported as one cell of their
    product domain through the frequency oracle ``encoding`` (``auto``: the one of lowest
    variance, :func:`~veil.shared.kinds.oracles.choose_oracle`) at ``epsilon`` (all reports
    of one tuple) and ``report_epsilon`` (one report; default ``epsilon / 2``); ``g``: OLH's
    buckets (chosen when omitted); ``marginals``: report one assigned marginal of that many
    variables instead of the tuple (omitted: the tuple). See the module docstring."""

    kind: ClassVar[str] = "joint"
    min_wire_version: ClassVar[int] = 2
    omitted_when_default: ClassVar[frozenset[str]] = frozenset({"marginals"})
    sized_by: ClassVar[tuple[str, ...]] = ("marginals", "domains")

    of: tuple[str, ...] = ()
    domains: tuple[Any, ...] = ()
    epsilon: float = 2.0
    report_epsilon: float | None = None
    encoding: str = "auto"
    g: int | None = None
    marginals: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        names = tuple(self.of) if isinstance(self.of, list | tuple) else None
        if not names or not 2 <= len(names) <= MAX_VARIABLES \
                or not all(isinstance(n, str) and n for n in names) \
                or len(set(names)) != len(names):
            raise ParameterError(
                "of", f"The 'of' parameter of {owner} must list 2 to {MAX_VARIABLES} distinct "
                      f"variable names. Got {self.of!r} instead.")
        domains = tuple(self.domains) if isinstance(self.domains, list | tuple) else ()
        if len(domains) != len(names):
            raise ParameterError(
                "domains", f"The 'domains' parameter of {owner} must give one domain per "
                           f"variable of of={list(names)!r}. Got {self.domains!r:.200} instead.")
        parsed = [parse_domain(owner, f"domains[{i}]", name, domain)
                  for i, (name, domain) in enumerate(zip(names, domains, strict=True))]
        object.__setattr__(self, "of", names)
        object.__setattr__(self, "domains", tuple(stored for stored, _ in parsed))
        object.__setattr__(self, "_variables", tuple(variable for _, variable in parsed))
        self._check_marginals(owner)
        cells = self.oracle_cells
        if cells > MAX_ORACLE_CATEGORIES:
            what = "a marginal" if self.marginals else "the product domain"
            raise ParameterError(
                "domains", f"{owner}: {what} has {cells} cells, more than the "
                           f"{MAX_ORACLE_CATEGORIES} an oracle takes; bucket or drop a variable")
        settle_epsilons(self)
        self._choose_encoding(owner)

    def _check_marginals(self, owner: str) -> None:
        """Validate ``marginals`` and lay out :attr:`marginal_sets`."""
        variables = len(self.of)
        if self.marginals is None:
            object.__setattr__(self, "_sets", (tuple(range(variables)),))
            return
        if variables < 3:
            raise ParameterError(
                "marginals", f"{owner}: marginals takes three or more variables; with "
                             f"{variables} one report of the tuple is the joint table, so omit it")
        if isinstance(self.marginals, bool) or not isinstance(self.marginals, int) \
                or not 2 <= self.marginals < variables:
            raise ParameterError(
                "marginals", f"The 'marginals' parameter of {owner} must be a whole number from "
                             f"2 to {variables - 1} (the variables of 'of' less one). "
                             f"Got {self.marginals!r} instead.")
        object.__setattr__(self, "_sets",
                           tuple(itertools.combinations(range(variables), self.marginals)))

    def _choose_encoding(self, owner: str) -> None:
        """Resolve ``encoding = "auto"`` and OLH's ``g``, and build :attr:`cell_oracle`."""
        cells = tuple(str(i) for i in range(self.oracle_cells))
        if self.encoding == "auto":
            if self.g is not None:
                raise ParameterError("g", f"{owner}: g applies to encoding = 'olh' only")
            chosen, why = choose_oracle(cells, self.epsilon, self.report_epsilon)
            object.__setattr__(self, "_note", why.replace(" categories ", " cells "))
            object.__setattr__(self, "encoding", chosen.oracle)
        elif not isinstance(self.encoding, str) or self.encoding not in ORACLES:
            raise ParameterError(
                "encoding", f"The 'encoding' parameter of {owner} must be one of "
                            f"{', '.join(map(repr, ['auto', *ORACLES]))}. "
                            f"Got {self.encoding!r} instead.")
        cls = ORACLES[self.encoding]
        extra: dict[str, Any] = {}
        if any(field.name == "g" for field in dataclasses.fields(cls)):
            extra["g"] = self.g
        elif self.g is not None:
            raise ParameterError("g", f"{owner}: g applies to encoding = 'olh' only")
        oracle = cls(categories=cells, epsilon=self.epsilon, report_epsilon=self.report_epsilon,
                     **extra)
        if "g" in extra:
            object.__setattr__(self, "g", oracle.g)  # type: ignore[attr-defined]
        object.__setattr__(self, "_oracle", oracle)

    # --- the product domain ------------------------------------------------------------

    @property
    def variables(self) -> tuple[Variable, ...]:
        """The variables, in the order of ``of``."""
        variables: tuple[Variable, ...] = self.__dict__["_variables"]
        return variables

    @property
    def shape(self) -> tuple[int, ...]:
        """The number of values of each variable: the joint table's shape."""
        return tuple(len(variable.labels) for variable in self.variables)

    @property
    def cells(self) -> int:
        """Cells of the product domain."""
        return math.prod(self.shape)

    @property
    def marginal_sets(self) -> tuple[tuple[int, ...], ...]:
        """The variables (their positions in ``of``) of each marginal an installation may be
        assigned, the cohort's number its index; one set of every variable without
        ``marginals``."""
        sets: tuple[tuple[int, ...], ...] = self.__dict__["_sets"]
        return sets

    @property
    def cohorts(self) -> int:
        """The marginals (``C(v, marginals)``), one cohort each; 1 without ``marginals``."""
        return len(self.marginal_sets)

    @property
    def has_cohorts(self) -> bool:  # type: ignore[override]
        """Whether reports carry a cohort: the marginal's number, with ``marginals``."""
        return self.marginals is not None

    def marginal_shape(self, marginal: int) -> tuple[int, ...]:
        """The number of values of each variable of marginal ``marginal``."""
        shape = self.shape
        return tuple(shape[i] for i in self.marginal_sets[marginal])

    @property
    def oracle_cells(self) -> int:
        """Categories of the cell oracle: the largest marginal's cells (the product domain's
        without ``marginals``)."""
        return max(math.prod(self.marginal_shape(j)) for j in range(self.cohorts))

    @property
    def cell_oracle(self) -> OracleParams:
        """The frequency oracle over the cells (category ``str(i)`` is cell ``i``)."""
        oracle: OracleParams = self.__dict__["_oracle"]
        return oracle

    @property
    def choice_note(self) -> str:
        """Why ``encoding = "auto"`` chose the oracle ("" when ``encoding`` named it)."""
        return str(self.__dict__.get("_note", ""))

    def cell_of(self, value: Any) -> int:
        """The cell of a tuple: ``value`` is a mapping from each variable's name to its value,
        or a sequence of the values in the order of ``of``. A :class:`ParameterError` names
        the variable at fault (``value.NAME``) and what is wrong."""
        return self._row_major(self.value_indices(value), range(len(self.of)))

    def marginal_cell(self, marginal: int, value: Any) -> int:
        """The cell of the tuple ``value`` (the whole tuple, as :meth:`cell_of` takes it) in
        marginal ``marginal``: row-major over that marginal's variables."""
        return self._row_major(self.value_indices(value), self.marginal_sets[marginal])

    def _row_major(self, indices: Sequence[int], chosen: Sequence[int]) -> int:
        cell = 0
        for i in chosen:
            cell = cell * len(self.variables[i].labels) + indices[i]
        return cell

    def value_indices(self, value: Any) -> tuple[int, ...]:
        """Each variable's value index in the tuple ``value`` (see :meth:`cell_of`). Errors
        name the variables and the value's type, never a value; a dict's keys that name no
        variable are counted, not shown (a key may be anything the application put there)."""
        variables = self.variables
        if isinstance(value, Mapping):
            missing = [v.name for v in variables if v.name not in value]
            extra = sum(1 for key in value if key not in self.of)
            if missing or extra:
                parts = ([f"misses {', '.join(map(repr, missing))}"] if missing else []) + (
                    [f"has {extra} {'key that names' if extra == 1 else 'keys that name'} no "
                     "variable"] if extra else [])
                raise ParameterError(
                    f"value.{missing[0]}" if missing else "value",
                    f"{' and '.join(parts)}: a report of this joint metric gives each of "
                    f"{', '.join(map(repr, self.of))}")
            items = [value[v.name] for v in variables]
        elif isinstance(value, tuple | list) and len(value) == len(variables):
            items = list(value)
        else:
            got = type_name(value)
            if isinstance(value, tuple | list):
                got += f" of {len(value)} value{'' if len(value) == 1 else 's'}"
            raise ParameterError(
                "value", f"must be a dict of {', '.join(map(repr, self.of))} (or a tuple of "
                         f"their values in that order); got {got}")
        out = []
        for variable, item in zip(variables, items, strict=True):
            try:
                out.append(variable.index(item))
            except ParameterError as problem:
                raise ParameterError(f"value.{variable.name}", problem.message) from None
        return tuple(out)

    def cell_label(self, cell: int) -> str:
        """A cell for people: ``browser=chrome, crashed=true``."""
        return ", ".join(f"{variable.name}={variable.labels[index]}"
                         for variable, index in zip(self.variables, self.cell_indices(cell),
                                                    strict=True))

    def cell_indices(self, cell: int) -> tuple[int, ...]:
        """Each variable's value index of ``cell`` (row-major, the last variable fastest)."""
        out = []
        for size in reversed(self.shape):
            cell, index = divmod(cell, size)
            out.append(index)
        return tuple(reversed(out))

    # --- every face delegates to the cell oracle --------------------------------------

    @property
    def statistic(self) -> str:
        return self.cell_oracle.statistic

    @property
    def epsilon_1(self) -> float:
        return self.cell_oracle.epsilon_1

    @property
    def epsilon_inf(self) -> float:
        return self.cell_oracle.epsilon_inf

    @property
    def possible_values(self) -> tuple[int | None, str]:
        """The cells an installation may report: the product domain's, or with ``marginals``
        those of the largest marginal it may be assigned."""
        return self.oracle_cells, "cells"

    @property
    def support_probs(self) -> tuple[float, float]:
        """``(p, q)`` of the cell oracle: a report supports its own cell / another cell."""
        return self.cell_oracle.support_probs

    def share_variance(self, share: float = 0.0, reports: int = 1) -> float:
        """Variance of one cell's estimated share (the cell oracle's)."""
        return self.cell_oracle.share_variance(share, reports)

    @property
    def responses(self) -> int:
        """Distinct payloads of the cell oracle (its ``responses`` statistic's length)."""
        return self.cell_oracle.responses

    @property
    def k(self) -> int:
        """Bits of an OUE report (one per oracle cell; its ``bits`` statistic's length)."""
        return self.oracle_cells

    @property
    def report_bytes(self) -> int:
        """Bytes of one report on a compact wire."""
        return self.cell_oracle.report_bytes

    def parse_payload(self, payload: Any, field: str = "payload") -> Any:
        return self.cell_oracle.parse_payload(payload, field)

    # --- settings ---------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> tuple[MechanismParams, str]:
        """As :meth:`from_dict`, with ``max_report_bytes`` (a cap on the oracle ``auto`` may
        choose, as for category metrics); the note says which oracle ``auto`` chose."""
        settings = dict(settings)
        cap = check_report_cap(settings.pop("max_report_bytes", None))
        params = cls.from_dict(settings)
        assert isinstance(params, JointParams)
        if cap is None or params.report_bytes <= cap:
            return params, params.choice_note
        if settings.get("encoding", "auto") != "auto":
            raise ParameterError(
                "max_report_bytes",
                f"{params.encoding} reports over {params.cells} cells take "
                f"{params.report_bytes} bytes, more than max_report_bytes={cap!r}")
        chosen, why = choose_oracle(params.cell_oracle.categories, params.epsilon,
                                    params.report_epsilon, cap)
        params = dataclasses.replace(params, encoding=chosen.oracle,
                                     g=getattr(chosen, "g", None))
        return params, why.replace(" categories ", " cells ")


def declared_domains(name: str, of: Sequence[Any],
                     params_of: Callable[[str], MechanismParams | None]) -> list[Any]:
    """The ``domains`` of a joint metric ``name`` whose ``of`` names metrics of its registry
    (``params_of`` gives a metric's parameters, ``None`` for a name the registry lacks): a
    category metric's categories, a boolean metric's ``"boolean"``. Number and string
    metrics have no finite domain of their own; the error says to give ``domains``."""
    out: list[Any] = []
    for i, variable in enumerate(of):
        where = f"metrics.{name}.of[{i}]"
        params = params_of(variable) if isinstance(variable, str) else None
        if params is None:
            raise ParameterError(
                where, f"metrics.{name}: of[{i}] = {variable!r} names no metric of this "
                       "registry; name one, or give every variable's domain in domains")
        if isinstance(params, CategoryList):
            out.append(list(params.categories))
        elif isinstance(params, BooleanParams):
            out.append(BOOLEAN)
        else:
            raise ParameterError(
                where, f"metrics.{name}: of[{i}] = {variable!r} is a {params.kind} metric, "
                       "whose values have no finite domain; give domains (bucket edges for "
                       "a number, the candidates as categories for a string)")
    return out
