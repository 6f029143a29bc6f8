"""google/rappor's association inputs: the files its ``bin/decode_assoc.R`` reads.

- the schema (``--schema``): header ``metric,var,var_type,params``, one row per variable;
  ``var_type`` is ``string`` or ``boolean``, ``params`` names ``<params-dir>/<params>.csv``
  (header ``k,h,m,p,q,f``).
- the reports (``--reports``): a header naming a ``cohort`` column and one column per
  variable (others, such as ``client``, are ignored); one row per client: its 0-based
  cohort (taken modulo ``m``, as google/rappor does, however many digits it has) and each
  variable's report as an ASCII bit string, bit ``k-1`` first (a boolean is ``0`` or ``1``).
- a ``map.csv`` for each string variable (:func:`~veil.server.analysis.candidate_map.read_map`).

Both CSV files are UTF-8 (a byte order mark is allowed) and read strictly: every row has
as many fields as its header, a header names each column once, a quote is closed. Errors
name the file, the row (the file's line, blank lines included) and the column, and say
what to fix.

A string variable's report is a Bloom-filter RAPPOR report: given candidate ``j``, bit
``i`` of cohort ``c`` reads 1 with probability ``q*`` where ``j`` sets it and ``p*``
elsewhere. A boolean is one-bit basic RAPPOR with the same parameters (its bit is 1 for
TRUE), as google/rappor encodes it. :func:`read_assoc_files` reads the reports in chunks
and keeps only the distinct (cohort, report, report) rows with their counts, then the
distinct likelihood rows of each variable (:class:`~veil.server.analysis.assoc_em.GroupedLikelihoods`).
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from veil.server.analysis.assoc_em import GroupedLikelihoods
from veil.server.analysis.candidate_map import read_map
from veil.server.counts import csv_records, read_params
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams

if TYPE_CHECKING:
    import scipy.sparse as sp

#: the variable types of google/rappor's schema
VAR_TYPES = ("string", "boolean")
#: the schema's columns
SCHEMA_COLUMNS = ("metric", "var", "var_type", "params")
#: google/rappor's labels of a boolean's two values, in its order
BOOLEAN_VALUES = ("TRUE", "FALSE")
#: report rows read at once
CHUNK_ROWS = 250_000
#: cohorts of up to this many digits are read by NumPy (they fit an int64); longer ones
#: are reduced modulo ``m`` digit by digit
COHORT_DIGITS = 18


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


def _shown(text: str, limit: int = 60) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def _schema_rows(path: str | Path) -> list[tuple[int, dict[str, str]]]:
    """The schema's rows, each with its line, fields trimmed; the header checked."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ParameterError("schema", f"cannot read schema file {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParameterError("schema", f"{path}: not UTF-8 text (byte {exc.start}) on line "
                                       f"{line}: save it as UTF-8") from None
    needs = f"needs a header {','.join(SCHEMA_COLUMNS)} and one row per variable"
    header: list[str] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    for line, raw in csv_records(io.StringIO(text, newline=""), str(path), "schema"):
        fields = [field.strip() for field in raw]
        if not any(fields):
            continue
        if header is None:
            header = fields
            if any(header.count(column) != 1 for column in SCHEMA_COLUMNS):
                raise ParameterError("schema", f"{path}: {needs} (each column once); its "
                                               f"header is {_shown(','.join(header))}")
        elif len(fields) != len(header):
            raise ParameterError("schema", (
                f"{path} line {line} has {len(fields)} field(s) ({_shown(','.join(fields))}) "
                f"but its header {','.join(header)} has {len(header)}: give each variable "
                "one field per column"))
        else:
            rows.append((line, dict(zip(header, fields, strict=True))))
    if header is None:
        raise ParameterError("schema", f"{path}: {needs}")
    return rows


def read_schema(path: str | Path, metric: str, var: str) -> tuple[str, str]:
    """``(var_type, params name)`` of ``metric``'s variable ``var`` in the schema file
    (fields trimmed; two rows that describe the variable differently are refused)."""
    found = [(line, row) for line, row in _schema_rows(path)
             if row["metric"] == metric and row["var"] == var]
    if not found:
        raise ParameterError("var", f"{path} has no variable {var!r} of metric {metric!r} "
                                    "(check --metric-name, --var1 and --var2)")
    (line, row), *others = found
    for other_line, other in others:
        if (other["var_type"], other["params"]) != (row["var_type"], row["params"]):
            raise ParameterError("schema", (
                f"{path} lines {line} and {other_line} describe variable {var} of metric "
                f"{metric} differently ({row['var_type']},{row['params']} and "
                f"{other['var_type']},{other['params']}): keep one of them"))
    var_type = row["var_type"]
    if var_type not in VAR_TYPES:
        raise ParameterError("schema", f"{path} line {line}: variable {var} has type "
                                       f"{var_type!r}; supported: {', '.join(VAR_TYPES)}")
    if not row["params"]:
        raise ParameterError("schema", f"{path} line {line}: variable {var} names no params "
                                       "file (the params column is empty)")
    return var_type, row["params"]


def read_variable(schema: str | Path, params_dir: str | Path, metric: str, var: str,
                  map_path: str | Path | None, option: str) -> AssocVariable:
    """A variable from the schema, its parameters file and (a string's) map; ``option``
    names the map's command-line option in errors."""
    var_type, params_name = read_schema(schema, metric, var)
    params_path = Path(params_dir) / f"{params_name}.csv"
    params = read_params(params_path, "md5-google")
    params.check_informative(str(params_path), var)
    if var_type == "boolean":
        if map_path:
            raise ParameterError(option, f"{var} is a boolean: it needs no map (drop {option})")
        return AssocVariable(var, var_type, params, list(BOOLEAN_VALUES))
    if not map_path:
        raise ParameterError(option, f"{var} is a string: give its map.csv with {option}")
    candidates, matrix = read_map(map_path, params, str(params_path))
    return AssocVariable(var, var_type, params, candidates, matrix)


def _not_utf8(path: str | Path) -> ParameterError:
    """The reports file is not UTF-8: where it stops being so (byte from 0, and row)."""
    offset = 0
    try:
        with open(path, "rb") as handle:
            for line, raw in enumerate(handle, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    utf16 = line == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff")
                    return ParameterError("reports", (
                        f"{path}: not UTF-8 text (byte {offset + exc.start}) in row {line}: "
                        f"{'it looks like UTF-16; ' if utf16 else ''}save it as UTF-8"))
                offset += len(raw)
    except OSError:
        pass
    return ParameterError("reports", f"{path}: not UTF-8 text: save it as UTF-8")


def _report_columns(path: str | Path, header: list[str], names: tuple[str, ...]) -> list[int]:
    """The position of each of ``names`` in the reports' header (trimmed), which must name
    each column once."""
    shown = _shown(",".join(header), 200)
    if not any(header):
        raise ParameterError("reports", f"{path} is empty: it needs a header naming the columns "
                                        f"{', '.join(names)}, then one row per client")
    twice = [name for name, count in Counter(header).items() if count > 1]
    if twice:
        raise ParameterError("reports", f"{path}: its header names the column {twice[0]!r} "
                                        f"more than once ({shown}): give each column its own name")
    missing = [name for name in names if name not in header]
    if missing:
        raise ParameterError("reports", f"{path} has no column {missing[0]!r} (its header: "
                                        f"{shown})")
    return [header.index(name) for name in names]


ReportChunk = tuple[np.ndarray, list[str], list[str], list[str]]


def _report_chunks(path: str | Path, names: tuple[str, str, str], size: int,
                   ) -> Iterator[ReportChunk]:
    """The reports file's row (line) of every report and its fields in the three columns
    ``names``, ``size`` reports at a time (:func:`_report_records`)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            yield from _report_records(handle, path, names, size)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except OSError as exc:
        raise ParameterError("reports", f"cannot read reports file {path}: {exc.strerror}") from None


def _report_records(handle: Iterator[str], path: str | Path, names: tuple[str, str, str],
                    size: int) -> Iterator[ReportChunk]:
    """:func:`_report_chunks` of an open file. Blank lines are skipped; a row with more or
    fewer fields than the header, and a quote never closed, are refused by row."""
    records = csv_records(handle, str(path), "reports", "row")
    header: list[str] = []
    for _, header in records:
        if any(field.strip() for field in header):
            break
    header = [field.strip() for field in header]
    first, second, third = _report_columns(path, header, names)
    width = len(header)
    lines: list[int] = []
    columns: tuple[list[str], list[str], list[str]] = ([], [], [])
    for line, row in records:
        if len(row) != width:
            if len(row) <= 1 and not "".join(row).strip():
                continue  # a blank line
            raise ParameterError("reports", (
                f"{path} row {line} has {len(row)} field(s) but the header has {width} "
                f"({_shown(','.join(header), 200)}): give each row one field per column "
                "(look for a missing or extra comma)"))
        lines.append(line)
        columns[0].append(row[first])
        columns[1].append(row[second])
        columns[2].append(row[third])
        if len(lines) == size:
            yield np.array(lines, dtype=np.int64), *columns
            lines, columns = [], ([], [], [])
    if lines:
        yield np.array(lines, dtype=np.int64), *columns


def _digits_modulo(text: str, modulus: int) -> int | None:
    """``text``, ASCII digits of any length, modulo ``modulus``; None if it is not digits."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = 0
    for start in range(0, len(text), COHORT_DIGITS):
        part = text[start:start + COHORT_DIGITS]
        value = (value * 10 ** len(part) + int(part)) % modulus
    return value


def _cohorts(texts: list[str], modulus: int) -> tuple[np.ndarray, np.ndarray]:
    """Each report's cohort modulo ``modulus``, and which texts are not whole numbers >= 0
    (ASCII digits only: no sign, space, or digits of other scripts)."""
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    long = np.flatnonzero(lengths > COHORT_DIGITS)
    if long.size:
        texts = list(texts)
        for index in long.tolist():
            value = _digits_modulo(texts[index], modulus)
            texts[index] = "-" if value is None else str(value)
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    values = np.array(texts)
    codes = values.view(np.uint32).reshape(values.size, -1)  # code points, 0 past the end
    inside = np.arange(codes.shape[1]) < lengths[:, None]
    bad = (lengths == 0) | ((codes - np.uint32(ord("0")) > 9) & inside).any(axis=1)
    cohorts = np.where(bad, "0", values).astype(np.int64) % modulus
    return cohorts, bad


def _bit_matrix(texts: list[str], width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, width)`` 0/1 bits of the reports (column ``i`` is bit ``i``: the text has bit
    ``width-1`` first), and which texts are not ``width`` characters of 0 and 1."""
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    try:
        raw = np.array(texts, dtype=f"S{width}")  # a longer text is cut here, refused below
    except UnicodeEncodeError:  # a text beyond ASCII: refused, as an empty one would be
        raw = np.array([text if text.isascii() else "" for text in texts], dtype=f"S{width}")
    digits = np.frombuffer(raw.tobytes(), np.uint8).reshape(-1, width) - np.uint8(ord("0"))
    bad = (lengths != width) | (digits > 1).any(axis=1)
    return digits[:, ::-1], bad


def _refuse_bad_rows(path: str | Path, lines: np.ndarray,
                     checks: list[tuple[np.ndarray, str, list[str]]]) -> None:
    """Refuse the first row that fails any of the checks ``(bad, rule, texts)``."""
    firsts = [(int(np.argmax(bad)), rule, texts) for bad, rule, texts in checks if bad.any()]
    if firsts:
        index, rule, texts = min(firsts, key=lambda first: first[0])
        raise ParameterError("reports", f"{path} row {lines[index]}: {rule}; got "
                                        f"{_shown(texts[index])}")


def _bits_rule(variable: AssocVariable) -> str:
    """What each report of ``variable`` must be."""
    return (f"{variable.name} must be {variable.bits} character{'s' if variable.bits > 1 else ''}"
            " of 0 and 1")


@dataclasses.dataclass(frozen=True)
class ReportGroups:
    """The distinct ``(cohort, first report, second report)`` rows of a reports file:
    ``cohort`` (modulo ``m``), each variable's bits (column ``i`` is bit ``i``), the
    reports each holds (``weights``), the file row it first appears on (``rows``), and the
    number of reports (``total``)."""

    cohort: np.ndarray
    first_bits: np.ndarray
    second_bits: np.ndarray
    weights: np.ndarray
    rows: np.ndarray
    total: int


def read_grouped_reports(path: str | Path, first: AssocVariable, second: AssocVariable,
                         ) -> ReportGroups:
    """The distinct ``(cohort, bits of first, bits of second)`` rows of the reports file and
    how many reports each holds; memory follows the distinct rows, not the reports."""
    cohorts = first.params.m
    packed: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    seen: list[np.ndarray] = []
    total = 0
    names = ("cohort", first.name, second.name)
    for lines, cohort_text, first_text, second_text in _report_chunks(path, names, CHUNK_ROWS):
        cohort, bad_cohort = _cohorts(cohort_text, cohorts)
        first_bits, bad_first = _bit_matrix(first_text, first.bits)
        second_bits, bad_second = _bit_matrix(second_text, second.bits)
        _refuse_bad_rows(path, lines, [
            (bad_cohort, "cohort must be a whole number >= 0 (digits 0-9)", cohort_text),
            (bad_first, _bits_rule(first), first_text),
            (bad_second, _bits_rule(second), second_text),
        ])
        rows = np.concatenate([
            cohort.astype(">u4").view(np.uint8).reshape(-1, 4),
            np.packbits(first_bits, axis=1),
            np.packbits(second_bits, axis=1),
        ], axis=1)
        distinct, where, weight = np.unique(_as_void(rows), return_index=True,
                                            return_counts=True)
        packed.append(distinct)
        counts.append(weight)
        seen.append(lines[where])
        total += lines.size
    if not total:
        raise ParameterError("reports", f"{path} holds no reports")
    distinct, inverse = np.unique(np.concatenate(packed), return_inverse=True)
    inverse = inverse.reshape(-1)
    weights = np.bincount(inverse, weights=np.concatenate(counts))
    first_row = np.full(distinct.size, np.iinfo(np.int64).max)
    np.minimum.at(first_row, inverse, np.concatenate(seen))
    raw = distinct.view(np.uint8).reshape(distinct.size, -1)
    split = 4 + (first.bits + 7) // 8
    return ReportGroups(
        cohort=raw[:, :4].copy().view(">u4").reshape(-1).astype(np.int64),
        first_bits=np.unpackbits(raw[:, 4:split], axis=1, count=first.bits),
        second_bits=np.unpackbits(raw[:, split:], axis=1, count=second.bits),
        weights=weights, rows=first_row, total=total)


def _as_void(rows: np.ndarray) -> np.ndarray:
    """Each row of a 2-D uint8 array as one opaque value (for np.unique on rows)."""
    rows = np.ascontiguousarray(rows)
    return rows.view(np.dtype((np.void, rows.shape[1]))).reshape(-1)


def _log_or_zero(probability: float) -> float:
    """``log(probability)``, or 0 for a probability of 0 (for a count that is then 0)."""
    return math.log(probability) if probability > 0 else 0.0


def _string_log_likelihoods(variable: AssocVariable, cohort: np.ndarray, bits: np.ndarray,
                            ) -> np.ndarray:
    """``log P(report | candidate)`` of each report (``cohort``, ``bits``) and candidate, up
    to a constant per report; ``-inf`` where the candidate cannot give the report.

    With ``s`` the bits the candidate sets in the report's cohort, ``t`` of them read 1,
    and ``r`` bits reading 1 in all, the probability is ``q*^t (1-q*)^(s-t) p*^(r-t)
    (1-p*)^(k-s-r+t)``: its log is ``t A + s B`` plus a term of the report alone. It is 0
    where ``p* = 0`` and ``r > t`` (a 1 the candidate does not explain) or ``q* = 1`` and
    ``s > t`` (a 0 where it sets a bit); elsewhere those counts are 0, so their logs may
    be taken as 0 in ``A`` and ``B``."""
    p_star, q_star = variable.params.effective_probs
    log_q, log_not_q = _log_or_zero(q_star), _log_or_zero(1 - q_star)
    log_p, log_not_p = _log_or_zero(p_star), _log_or_zero(1 - p_star)
    per_hit, per_set = log_q - log_p - log_not_q + log_not_p, log_not_q - log_not_p
    k = variable.params.k
    ones = bits.sum(axis=1, dtype=float)[:, None]
    loglik = np.zeros((cohort.size, len(variable.values)))
    assert variable.candidate_map is not None  # a string variable has its map
    matrix = variable.candidate_map.tocsr()
    for c in np.unique(cohort):
        here = np.flatnonzero(cohort == c)
        block = matrix[c * k:(c + 1) * k].toarray()
        sets = block.sum(axis=0)[None, :]
        hits = bits[here].astype(float) @ block
        part = hits * per_hit + sets * per_set
        if p_star == 0:
            part[ones[here] > hits] = -np.inf
        if q_star == 1:
            part[sets > hits] = -np.inf
        loglik[here] = part
    return loglik


def likelihood_rows(variable: AssocVariable, cohort: np.ndarray, bits: np.ndarray,
                    rows: np.ndarray, source: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The distinct likelihood rows of ``variable`` over the given reports (each row scaled
    so its largest entry is 1) and the row of each report. ``rows`` (each report's row in
    the file ``source``) names a report no candidate can explain, which is refused."""
    p_star, q_star = variable.params.effective_probs
    if variable.var_type == "boolean":  # p* < q*: each row has a positive entry
        table = np.array([[1 - q_star, 1 - p_star], [q_star, p_star]])
        return table, bits[:, 0].astype(np.int64)
    keys = np.concatenate([cohort[:, None].astype(">u4").view(np.uint8).reshape(-1, 4),
                           np.packbits(bits, axis=1)], axis=1)
    _, first_seen, inverse = np.unique(_as_void(keys), return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    loglik = _string_log_likelihoods(variable, cohort[first_seen], bits[first_seen])
    best = loglik.max(axis=1)
    impossible = np.isneginf(best)
    if impossible.any():
        index = int(np.argmin(np.where(impossible[inverse], rows, np.iinfo(np.int64).max)))
        raise _unexplained(variable, source, int(rows[index]), int(cohort[index]), bits[index])
    distinct, row_of = np.unique(np.exp(loglik - best[:, None]), axis=0, return_inverse=True)
    return distinct, row_of.reshape(-1)[inverse]


def _unexplained(variable: AssocVariable, source: str | Path, row: int, cohort: int,
                 bits: np.ndarray) -> ParameterError:
    """A report no candidate of the map could have sent (``p* = 0`` or ``q* = 1``)."""
    params = variable.params
    p_star, q_star = params.effective_probs
    why = (["with p* = 0 a bit reads 1 only where the value sets it"] if p_star == 0 else []) + (
        ["with q* = 1 every bit the value sets reads 1"] if q_star == 1 else [])
    text = "".join("1" if bit else "0" for bit in bits[::-1])
    return ParameterError("reports", (
        f"{source} row {row}: no candidate of {variable.name}'s map could have sent its report "
        f"{text} in cohort {cohort} ({'; '.join(why)}): the client's value is missing from the "
        f"map, or p={params.p}, q={params.q}, f={params.f} are not the clients' parameters"))


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
    if "cohort" in (var1, var2):
        raise ParameterError("var", "a variable cannot be named 'cohort': the reports' cohort "
                                    "column has that name")
    first = read_variable(schema, params_dir, metric_name, var1, map1, "--map1")
    second = read_variable(schema, params_dir, metric_name, var2, map2, "--map2")
    if first.params.m != second.params.m:
        raise ParameterError("params", f"{var1} and {var2} must share their cohorts: m = "
                                       f"{first.params.m} and {second.params.m}")
    grouped = read_grouped_reports(reports, first, second)
    first_rows, first_index = likelihood_rows(first, grouped.cohort, grouped.first_bits,
                                              grouped.rows, reports)
    second_rows, second_index = likelihood_rows(second, grouped.cohort, grouped.second_bits,
                                                grouped.rows, reports)
    groups = GroupedLikelihoods.of(first_rows, second_rows, first_index, second_index,
                                   grouped.weights)
    return AssocInputs(first, second, groups, grouped.total)
