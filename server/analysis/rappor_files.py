"""google/rappor's interchange files: ``params.csv``, ``counts.csv`` and ``map.csv``.

* ``params.csv``: header ``k,h,m,p,q,f`` (quoted or not), one row.
* ``counts.csv``: no header, ``m`` rows in cohort order; column 1 is the number
  of reports in the cohort, then the count of set bits for bit 0..k-1.
* ``map.csv``: no header; a candidate, then its ``m*h`` 1-based indices
  ``cohort*k + bit + 1`` (cohort 0..m-1, hash 0..h-1). Empty fields are
  ignored (google/rappor's R tools leave them where hashes collide).

Readers accept files written by google/rappor unchanged and name the file and
the sizes when dimensions disagree. The writers are the only ones in Veil:
``veil export``, the collector's ``format=csv`` counts and the analysis use them.
Only NumPy is imported up front (the collector has no SciPy); maps load SciPy
when read or written.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from veil.server.analysis.counts import counts_arrays, counts_document
from veil.shared.errors import ParameterError
from veil.shared.kinds import MechanismParams, StringParams

if TYPE_CHECKING:
    import scipy.sparse as sp

PARAMS_HEADER = ["k", "h", "m", "p", "q", "f"]

PathOrFile = str | Path | IO[str]


def _rows(source: PathOrFile, what: str) -> tuple[str, list[list[str]]]:
    """The CSV rows of a file (path or open text file) and a name for errors."""
    if isinstance(source, str | Path):
        name = str(source)
        try:
            with open(source, newline="", encoding="utf-8") as handle:
                return name, list(csv.reader(handle))
        except OSError as exc:
            raise ParameterError(what, f"cannot read {what} file {name}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ParameterError(what, f"{name}: not UTF-8 text (byte {exc.start})") from None
        except csv.Error as exc:
            raise ParameterError(what, f"{name}: not valid CSV: {exc}") from None
    name = getattr(source, "name", f"<{what}>")
    return str(name), list(csv.reader(source))


def _open_out(target: PathOrFile) -> tuple[IO[str], bool]:
    if isinstance(target, str | Path):
        return open(target, "w", newline="", encoding="utf-8"), True
    return target, False


def read_params(source: PathOrFile, hashing: str = "mmh3") -> StringParams:
    """Parse ``params.csv`` into :class:`StringParams` with the given ``hashing``
    (``params.csv`` does not say: google/rappor's own clients hash with ``md5-google``)."""
    name, rows = _rows(source, "params")
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if len(rows) != 2:
        raise ParameterError(
            "params", f"{name}: expected a header k,h,m,p,q,f and one row; got {len(rows)} line(s)"
        )
    header = [cell.strip() for cell in rows[0]]
    if header != PARAMS_HEADER:
        raise ParameterError("params", f"{name}: header must be k,h,m,p,q,f; got {','.join(header)}")
    values = [cell.strip() for cell in rows[1]]
    if len(values) != 6:
        raise ParameterError("params", f"{name}: the row has {len(values)} fields; expected 6")
    parsed: dict[str, Any] = {}
    for key, text in zip(PARAMS_HEADER, values, strict=True):
        try:
            parsed[key] = int(text) if key in "khm" else float(text)
        except ValueError:
            kind = "an integer" if key in "khm" else "a number"
            raise ParameterError(key, f"{name}: {key} must be {kind}; got {text!r}") from None
    try:
        return StringParams(**parsed, hashing=hashing)
    except ParameterError as exc:
        raise ParameterError(exc.field, f"{name}: {exc}") from None


def write_params(params: StringParams, target: PathOrFile) -> None:
    """Write ``params.csv`` (unquoted header, one row)."""
    handle, close = _open_out(target)
    try:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(PARAMS_HEADER)
        writer.writerow([params.k, params.h, params.m, params.p, params.q, params.f])
    finally:
        if close:
            handle.close()


def read_counts(
    source: PathOrFile, params: StringParams | None = None, params_name: str = "params"
) -> tuple[np.ndarray, np.ndarray]:
    """Parse ``counts.csv`` into ``(reports per cohort, ones per cohort and bit)``."""
    name, rows = _rows(source, "counts")
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        raise ParameterError("counts", f"{name}: the file has no rows")
    widths = {len(row) for row in rows}
    if len(widths) != 1:
        raise ParameterError(
            "counts", f"{name}: rows have different numbers of fields ({sorted(widths)})"
        )
    try:
        table = np.array([[int(cell) for cell in row] for row in rows], dtype=np.int64)
    except ValueError as exc:
        raise ParameterError("counts", f"{name}: every field must be an integer count ({exc})") from None
    if params is not None:
        if table.shape[0] != params.m:
            raise ParameterError(
                "counts",
                f"{name} has {table.shape[0]} rows but {params_name} says m={params.m} cohorts",
            )
        if table.shape[1] != params.k + 1:
            raise ParameterError(
                "counts",
                f"{name} has {table.shape[1]} columns but {params_name} says k={params.k} "
                f"(expected 1 + k = {params.k + 1}: reports, then one count per bit)",
            )
    if np.any(table < 0):
        raise ParameterError("counts", f"{name}: counts must not be negative")
    return table[:, 0].copy(), table[:, 1:].copy()


def write_counts(reports: np.ndarray, ones: np.ndarray, target: PathOrFile) -> None:
    """Write ``counts.csv`` (no header)."""
    handle, close = _open_out(target)
    try:
        writer = csv.writer(handle, lineterminator="\n")
        for n, row in zip(np.asarray(reports), np.asarray(ones), strict=True):
            writer.writerow([int(n), *(int(v) for v in row)])
    finally:
        if close:
            handle.close()


def write_counts_document(document: dict[str, Any], target: PathOrFile) -> tuple[int, int]:
    """Write a RAPPOR metric's counts document as ``counts.csv``; return (reports, cohorts)."""
    arrays = counts_arrays(document)
    rappor_params(arrays.params)
    write_counts(arrays.reports, arrays.ones, target)
    return arrays.total_reports, len(arrays.reports)


def rappor_params(params: MechanismParams) -> StringParams:
    """The google/rappor parameters of a RAPPOR metric; :class:`ParameterError` otherwise."""
    rappor = params.as_rappor()
    if not isinstance(rappor, StringParams):
        raise ParameterError(
            "kind",
            f"google/rappor files exist only for metrics reported with RAPPOR bits (strings, "
            f"categories); this is a {params.kind} metric: use the JSON counts",
        )
    return rappor


def read_map(
    source: PathOrFile, params: StringParams, params_name: str = "params"
) -> tuple[list[str], sp.csc_matrix]:
    """Parse ``map.csv`` into candidates and a 0/1 CSC map of shape ``(m*k, n)``.

    A file of plain rows (no quotes; indices of digits and commas only) is parsed in
    bulk by NumPy, which keeps 100,000 candidates within a few hundred MB; any other
    file goes through the CSV reader row by row.
    """
    import scipy.sparse as sp

    name = str(source) if isinstance(source, str | Path) else str(getattr(source, "name", "<map>"))
    parsed = _read_plain_map(source) if isinstance(source, str | Path) else None
    if parsed is None:
        parsed = _read_csv_map(source, name)
    candidates, per_line, flat = parsed
    if not candidates:
        raise ParameterError("map", f"{name}: the file lists no candidates")
    size = params.m * params.k
    _check_map_indices(name, params, params_name, per_line, flat)
    if len(set(candidates)) != len(candidates):
        seen: set[str] = set()
        for candidate in candidates:
            if candidate in seen:
                raise ParameterError("map", f"{name}: candidate {candidate!r} is listed twice")
            seen.add(candidate)
    # one sort of (line, index) keys: each line's indices sorted, repeats (Bloom OR) once
    # (in place where it can: these arrays hold every index of the file)
    key_dtype = np.int32 if len(candidates) * size < 2**31 else np.int64
    keys: np.ndarray = np.repeat(np.arange(len(candidates), dtype=key_dtype), per_line)
    keys *= size
    keys += flat.astype(key_dtype, copy=False)  # checked: within 1..m*k
    keys -= 1
    del flat
    keys.sort()  # np.unique hashes, far slower at millions of keys
    if keys.size:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    lines, rows = np.divmod(keys, size)
    del keys
    indptr = np.zeros(len(candidates) + 1, dtype=np.int64)
    np.cumsum(np.bincount(lines, minlength=len(candidates)), out=indptr[1:])
    del lines
    index_dtype = np.int32 if size < 2**31 and indptr[-1] < 2**31 else np.int64
    matrix = sp.csc_matrix(
        (np.ones(rows.size), rows.astype(index_dtype), indptr.astype(index_dtype)),
        shape=(size, len(candidates)),
    )
    matrix.has_sorted_indices = True
    return candidates, matrix


#: a map file's candidates, how many indices each line lists, and all indices in line order
MapRows = tuple[list[str], np.ndarray, np.ndarray]


def _read_plain_map(path: str | Path) -> MapRows | None:
    """``map.csv`` read in bulk, or ``None`` when a row needs the CSV reader (quotes,
    spaces or other characters among the indices, a candidate that is not UTF-8).

    Lines whose fields are all blank are skipped; empty index fields are ignored.
    """
    candidates: list[str] = []
    per_line: list[int] = []
    rests: list[bytes] = []
    try:
        with open(path, "rb") as handle:
            for raw in handle:
                line = raw[:-1] if raw.endswith(b"\n") else raw
                line = line[:-1] if line.endswith(b"\r") else line
                if b'"' in line or b"\r" in line:
                    return None
                if not line.replace(b",", b"").strip():
                    continue
                candidate, _, rest = line.partition(b",")
                if rest.translate(None, b"0123456789,"):
                    return None
                rest = rest.strip(b",")
                while b",," in rest:
                    rest = rest.replace(b",,", b",")
                candidates.append(candidate.decode("utf-8"))
                per_line.append(rest.count(b",") + 1 if rest else 0)
                if rest:
                    rests.append(rest)
    except OSError as exc:
        raise ParameterError("map", f"cannot read map file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        return None
    counts = np.array(per_line, dtype=np.int64)
    joined = b",".join(rests)
    rests.clear()
    flat = np.fromstring(joined, dtype=np.int64, sep=",") if joined else np.zeros(0, np.int64)
    del joined
    if flat.size != counts.sum():  # a number too long for int64: let the CSV path say so
        return None
    return candidates, counts, flat


def _read_csv_map(source: PathOrFile, name: str) -> MapRows:
    """``map.csv`` through the CSV reader, one row at a time."""
    candidates: list[str] = []
    row_index: list[np.ndarray] = []
    try:
        with (
            open(source, newline="", encoding="utf-8") if isinstance(source, str | Path)
            else nullcontext(source)
        ) as handle:
            for row in csv.reader(handle):
                if not (row and any(cell.strip() for cell in row)):
                    continue
                candidates.append(row[0])
                try:
                    row_index.append(
                        np.array([int(cell) for cell in row[1:] if cell.strip()], dtype=np.int64)
                    )
                except (ValueError, OverflowError):
                    raise ParameterError(
                        "map", f"{name} line {len(candidates)}: indices must be integers"
                    ) from None
    except OSError as exc:
        raise ParameterError("map", f"cannot read map file {name}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ParameterError("map", f"{name}: not UTF-8 text (byte {exc.start})") from None
    except csv.Error as exc:
        raise ParameterError("map", f"{name}: not valid CSV: {exc}") from None
    counts = np.array([r.size for r in row_index], dtype=np.int64)
    flat = np.concatenate(row_index) if row_index else np.zeros(0, dtype=np.int64)
    return candidates, counts, flat


def _check_map_indices(
    name: str, params: StringParams, params_name: str, per_line: np.ndarray, flat: np.ndarray
) -> None:
    """At most ``m*h`` indices per line, each within ``1..m*k``; the error names the first
    line that breaks either rule."""
    size = params.m * params.k
    too_many = per_line > params.m * params.h
    ends = np.cumsum(per_line)
    outside_lines = np.searchsorted(ends, np.flatnonzero((flat < 1) | (flat > size)), side="right")
    bad = np.flatnonzero(too_many)
    first = min(int(bad[0]) if bad.size else len(per_line),
                int(outside_lines[0]) if outside_lines.size else len(per_line))
    if first == len(per_line):
        return
    line = first + 1
    if too_many[first]:
        raise ParameterError(
            "map",
            f"{name} line {line} has {per_line[first]} indices but {params_name} says "
            f"m*h = {params.m}*{params.h} = {params.m * params.h}",
        )
    indices = flat[ends[first] - per_line[first]: ends[first]]
    raise ParameterError(
        "map",
        f"{name} line {line}: index {int(indices.max() if indices.max() > size else indices.min())} "
        f"is outside 1..m*k = 1..{size} ({params_name}: m={params.m}, k={params.k})",
    )


def write_map(
    params: StringParams,
    candidates: Sequence[str],
    target: PathOrFile,
    progress: bool | None = None,
) -> None:
    """Write ``map.csv`` for ``candidates`` hashed as ``params.hashing`` says (all ``m*h``
    indices): with ``md5-google``, the bytes google/rappor's ``hash_candidates.py`` writes
    apart from line endings (LF here, CRLF there; google/rappor reads either)."""
    from veil.server.analysis.candidate_map import bloom_index_array

    indices = bloom_index_array(params, candidates, progress)
    offsets = (np.arange(params.m, dtype=np.int64) * params.k)[None, :, None]
    one_based = (indices + offsets + 1).reshape(len(candidates), -1)
    handle, close = _open_out(target)
    try:
        writer = csv.writer(handle, lineterminator="\n")
        for candidate, row in zip(candidates, one_based.tolist(), strict=True):
            writer.writerow([candidate, *row])
    finally:
        if close:
            handle.close()


@dataclasses.dataclass(frozen=True)
class RapporFiles:
    """google/rappor inputs read together: parameters, counts document, and the map."""

    params: StringParams
    counts: dict[str, Any]
    reports: np.ndarray
    ones: np.ndarray
    candidates: list[str] | None
    candidate_map: sp.csc_matrix | None


def read_rappor_files(
    params: PathOrFile,
    counts: PathOrFile,
    map: PathOrFile | None = None,
    hashing: str = "mmh3",
) -> RapporFiles:
    """Read ``params.csv``, ``counts.csv`` and (optionally) ``map.csv`` and check they agree.

    ``hashing`` is the clients' (:func:`read_params`): it hashes candidates given
    later without a map, and it names the parameters in the counts document."""
    params_name = str(params) if isinstance(params, str | Path) else "params"
    parsed = read_params(params, hashing)
    reports, ones = read_counts(counts, parsed, params_name)
    candidates = candidate_map = None
    if map is not None:
        candidates, candidate_map = read_map(map, parsed, params_name)
    document = counts_document(parsed, reports, ones, metric="rappor")
    return RapporFiles(parsed, document, reports, ones, candidates, candidate_map)

