"""google/rappor's association inputs: the files its ``bin/decode_assoc.R`` reads.

- the schema (``--schema``): header ``metric,var,var_type,params``, one row per variable;
  ``var_type`` is ``string`` or ``boolean``, ``params`` names ``<params-dir>/<params>.csv``
  (header ``k,h,m,p,q,f``).
- the reports (``--reports``): a header naming a ``cohort`` column and one column per
  variable (others, such as ``client``, are ignored); one row per client: its 0-based
  cohort (taken modulo ``m``, as google/rappor does) and each variable's report as an
  ASCII bit string, bit ``k-1`` first (a boolean is ``0`` or ``1``).
- a ``map.csv`` for each string variable (:func:`~veil.server.analysis.candidate_map.read_map`).

A string variable's report is a Bloom-filter RAPPOR report: given candidate ``j``, bit
``i`` of cohort ``c`` reads 1 with probability ``q*`` where ``j`` sets it and ``p*``
elsewhere. A boolean is one-bit basic RAPPOR with the same parameters (its bit is 1 for
TRUE), as google/rappor encodes it. :func:`read_assoc_files` reads the reports in chunks
and keeps only the distinct (cohort, report, report) rows with their counts, then the
distinct likelihood rows of each variable (:class:`~veil.server.analysis.assoc_em.GroupedLikelihoods`).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from veil.server.analysis.assoc_em import GroupedLikelihoods
from veil.server.analysis.candidate_map import read_map
from veil.server.counts import read_params
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams

if TYPE_CHECKING:
    import scipy.sparse as sp

#: the variable types of google/rappor's schema
VAR_TYPES = ("string", "boolean")
#: google/rappor's labels of a boolean's two values, in its order
BOOLEAN_VALUES = ("TRUE", "FALSE")
#: report rows read at once
CHUNK_ROWS = 250_000


@dataclasses.dataclass(frozen=True)
class AssocVariable:
    """One variable of the metric: its name, type, parameters and values (a string's map
    candidates, or TRUE and FALSE), with the string's map (``m*k`` x values)."""

    name: str
    var_type: str
    params: StringParams
    values: list[str]
    candidate_map: sp.csc_matrix | None = None

    @property
    def bits(self) -> int:
        """Characters in each of its reports: ``k`` for a string, 1 for a boolean."""
        return self.params.k if self.var_type == "string" else 1


def read_schema(path: str | Path, metric: str, var: str) -> tuple[str, str]:
    """``(var_type, params name)`` of ``metric``'s variable ``var`` in the schema file."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise ParameterError("schema", f"cannot read schema file {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ParameterError("schema", f"{path}: not a UTF-8 CSV file ({exc})") from None
    needed = {"metric", "var", "var_type", "params"}
    if not rows or not needed <= set(rows[0]):
        raise ParameterError("schema", f"{path}: needs a header metric,var,var_type,params and "
                                       "one row per variable")
    found = [row for row in rows if row["metric"] == metric and row["var"] == var]
    if not found:
        raise ParameterError("var", f"{path} has no variable {var!r} of metric {metric!r} "
                                    "(check --metric-name, --var1 and --var2)")
    var_type = found[0]["var_type"].strip()
    if var_type not in VAR_TYPES:
        raise ParameterError("schema", f"{path}: variable {var} has type {var_type!r}; "
                                       f"supported: {', '.join(VAR_TYPES)}")
    return var_type, found[0]["params"].strip()


def read_variable(schema: str | Path, params_dir: str | Path, metric: str, var: str,
                  map_path: str | Path | None, option: str) -> AssocVariable:
    """A variable from the schema, its parameters file and (a string's) map; ``option``
    names the map's command-line option in errors."""
    var_type, params_name = read_schema(schema, metric, var)
    params_path = Path(params_dir) / f"{params_name}.csv"
    params = read_params(params_path, "md5-google")
    if var_type == "boolean":
        if map_path:
            raise ParameterError(option, f"{var} is a boolean: it needs no map (drop {option})")
        return AssocVariable(var, var_type, params, list(BOOLEAN_VALUES))
    if not map_path:
        raise ParameterError(option, f"{var} is a string: give its map.csv with {option}")
    candidates, matrix = read_map(map_path, params, str(params_path))
    return AssocVariable(var, var_type, params, candidates, matrix)


def _chunks(path: str | Path, columns: list[str]) -> Iterator[list[np.ndarray]]:
    """The reports file's ``columns`` in chunks of :data:`CHUNK_ROWS` rows, as byte strings."""
    import pandas as pd

    try:
        with open(path, encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
    except OSError as exc:
        raise ParameterError("reports", f"cannot read reports file {path}: {exc.strerror}") from None
    missing = [column for column in columns if column not in header]
    if missing:
        raise ParameterError("reports", f"{path} has no column {missing[0]!r} (its header: "
                                        f"{','.join(header)})")
    reader = pd.read_csv(path, usecols=columns, dtype=str, keep_default_na=False,
                         chunksize=CHUNK_ROWS, engine="c")
    for frame in reader:
        yield [frame[column].to_numpy().astype(bytes) for column in columns]


def _bits(values: np.ndarray, width: int, name: str, first_row: int) -> np.ndarray:
    """``(n, width)`` 0/1 bits of ASCII bit strings (bit ``width-1`` first in the text,
    column ``i`` is bit ``i``); errors name the first bad row."""
    good = np.char.str_len(values) == width
    matrix = np.zeros((values.size, width), dtype=np.uint8)
    if good.all():
        matrix = np.frombuffer(values.astype(f"S{width}").tobytes(), np.uint8).reshape(-1, width)
        matrix = matrix - ord("0")
        good = (matrix <= 1).all(axis=1)
    if not good.all():
        row = first_row + int(np.flatnonzero(~good)[0])
        raise ParameterError("reports", f"row {row + 2} (counting the header as 1): {name} must "
                                        f"be {width} characters of 0 and 1; got "
                                        f"{values[row - first_row].decode(errors='replace')!r}")
    return matrix[:, ::-1]


def read_grouped_reports(path: str | Path, first: AssocVariable, second: AssocVariable,
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The distinct ``(cohort, bits of first, bits of second)`` rows of the reports file and
    how many reports each holds, and the number of reports."""
    cohorts = first.params.m
    packed: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    total = 0
    for cohort_text, first_text, second_text in _chunks(path, ["cohort", first.name, second.name]):
        if not np.char.isdigit(cohort_text).all():
            row = total + int(np.flatnonzero(~np.char.isdigit(cohort_text))[0])
            raise ParameterError("reports", f"row {row + 2}: cohort must be a whole number "
                                            f">= 0; got {cohort_text[row - total].decode()!r}")
        cohort = cohort_text.astype(np.int64) % cohorts
        rows = np.concatenate([
            cohort.astype(">u4").view(np.uint8).reshape(-1, 4),
            np.packbits(_bits(first_text, first.bits, first.name, total), axis=1),
            np.packbits(_bits(second_text, second.bits, second.name, total), axis=1),
        ], axis=1)
        distinct, weight = np.unique(_as_void(rows), return_counts=True)
        packed.append(distinct)
        counts.append(weight)
        total += cohort.size
    if not total:
        raise ParameterError("reports", f"{path} holds no reports")
    distinct, inverse = np.unique(np.concatenate(packed), return_inverse=True)
    weights = np.bincount(inverse.reshape(-1), weights=np.concatenate(counts))
    raw = distinct.view(np.uint8).reshape(distinct.size, -1)
    split = 4 + (first.bits + 7) // 8
    cohort = raw[:, :4].copy().view(">u4").reshape(-1).astype(np.int64)
    first_bits = np.unpackbits(raw[:, 4:split], axis=1, count=first.bits)
    second_bits = np.unpackbits(raw[:, split:], axis=1, count=second.bits)
    return cohort, first_bits, second_bits, weights, total


def _as_void(rows: np.ndarray) -> np.ndarray:
    """Each row of a 2-D uint8 array as one opaque value (for np.unique on rows)."""
    rows = np.ascontiguousarray(rows)
    return rows.view(np.dtype((np.void, rows.shape[1]))).reshape(-1)


def likelihood_rows(variable: AssocVariable, cohort: np.ndarray, bits: np.ndarray,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct likelihood rows of ``variable`` over the given reports (each row scaled
    so its largest entry is 1) and the row of each report."""
    p_star, q_star = variable.params.effective_probs
    if variable.var_type == "boolean":
        table = np.array([[1 - q_star, 1 - p_star], [q_star, p_star]])
        return table, bits[:, 0].astype(np.int64)
    k = variable.params.k
    keys = np.concatenate([cohort[:, None].astype(">u4").view(np.uint8).reshape(-1, 4),
                           np.packbits(bits, axis=1)], axis=1)
    _, first_seen, inverse = np.unique(_as_void(keys), return_index=True, return_inverse=True)
    cohort, bits = cohort[first_seen], bits[first_seen].astype(float)
    on, off = np.log(q_star / p_star), np.log((1 - q_star) / (1 - p_star))
    per_bit = bits * on + (1 - bits) * off  # log-ratio of each bit when a candidate sets it
    loglik = np.zeros((cohort.size, len(variable.values)))
    assert variable.candidate_map is not None  # a string variable has its map
    matrix = variable.candidate_map.tocsr()
    for c in np.unique(cohort):
        here = np.flatnonzero(cohort == c)
        loglik[here] = per_bit[here] @ matrix[c * k:(c + 1) * k].toarray()
    rows = np.exp(loglik - loglik.max(axis=1, keepdims=True))
    distinct, row_of = np.unique(rows, axis=0, return_inverse=True)
    return distinct, row_of.reshape(-1)[inverse.reshape(-1)]


@dataclasses.dataclass(frozen=True)
class AssocInputs:
    """The two variables and their reports, grouped for the EM."""

    first: AssocVariable
    second: AssocVariable
    groups: GroupedLikelihoods
    reports: int


def read_assoc_files(metric_name: str, schema: str | Path, params_dir: str | Path,
                     reports: str | Path, var1: str, var2: str,
                     map1: str | Path | None = None, map2: str | Path | None = None,
                     ) -> AssocInputs:
    """Read google/rappor's association inputs (the options of its ``decode_assoc.R``) and
    group the reports by their two likelihood rows."""
    if not metric_name:
        raise ParameterError("metric_name", "--metric-name is required")
    if not (var1 and var2) or var1 == var2:
        raise ParameterError("var", "give two different variables: --var1 and --var2")
    first = read_variable(schema, params_dir, metric_name, var1, map1, "--map1")
    second = read_variable(schema, params_dir, metric_name, var2, map2, "--map2")
    if first.params.m != second.params.m:
        raise ParameterError("params", f"{var1} and {var2} must share their cohorts: m = "
                                       f"{first.params.m} and {second.params.m}")
    cohort, first_bits, second_bits, weights, total = read_grouped_reports(reports, first, second)
    first_rows, first_index = likelihood_rows(first, cohort, first_bits)
    second_rows, second_index = likelihood_rows(second, cohort, second_bits)
    groups = GroupedLikelihoods.of(first_rows, second_rows, first_index, second_index, weights)
    return AssocInputs(first, second, groups, total)
