"""The candidate map: which Bloom bits each candidate string sets in each cohort.

Row ``c * k + bit`` of the map is bit ``bit`` of cohort ``c``; column ``s`` is
candidate ``s``. A candidate sets at most ``h`` bits per cohort (fewer when two
of its hashes collide: the Bloom filter is an OR). The hashing is exactly
:func:`veil.shared.hashing.bloom_indices` with the parameters' ``hashing`` (all cohorts at
once: :func:`~veil.shared.hashing.bloom_indices_all_cohorts`), the
function the client encodes with.

google/rappor's ``map.csv`` is the map as a file (:func:`read_map`, :func:`write_map`):
no header; a candidate, then its ``m*h`` 1-based indices ``cohort*k + bit + 1`` (cohort
0..m-1, hash 0..h-1), so cohort ``c`` holds indices ``c*k + 1 .. (c + 1)*k``.
google/rappor's ``hash_candidates.py`` writes all ``h`` indices of every cohort, repeats
included; its R simulation (``CreateMap``, ``tests/assoc_sim.R``) writes each set bit
once and leaves empty fields for the rest. Both are read: empty fields are ignored, and
each cohort must list from 1 to ``h`` different indices. The reader accepts
google/rappor's files unchanged (and with a UTF-8 byte order mark), names the file and
the sizes when dimensions disagree, and the line, candidate and cohort of a line that
cannot be a candidate's hashes.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from veil.server.counts import PathOrFile, csv_records, open_output, without_bom
from veil.shared.errors import ParameterError
from veil.shared.hashing import bloom_indices_all_cohorts, value_bytes
from veil.shared.kinds import StringParams


def bloom_index_array(
    params: StringParams, candidates: Sequence[str], progress: bool | None = None
) -> np.ndarray:
    """Raw hash indices, shape ``(len(candidates), m, h)``: what ``map.csv`` lists.

    ``progress`` shows a progress bar (default: only when stderr is a terminal
    and the list is long).
    """
    k, h, m, hashing = params.k, params.h, params.m, params.hashing
    out = np.empty((len(candidates), m, h), dtype=np.int32)
    show = _show_progress(progress, len(candidates) * m)
    iterator: Iterable[tuple[int, str]] = enumerate(candidates)
    if show:
        from tqdm import tqdm

        iterator = tqdm(iterator, total=len(candidates), desc="hashing candidates", unit="cand")
    flat = out.reshape(len(candidates), m * h)
    for s, candidate in iterator:
        try:
            data = value_bytes(candidate)
        except ParameterError as exc:
            raise ParameterError("candidates", f"candidate #{s + 1}: {exc}") from None
        flat[s] = bloom_indices_all_cohorts(data, m, k, h, hashing)
    return out


def indices_to_map(indices: np.ndarray, k: int, m: int) -> sp.csc_matrix:
    """A 0/1 CSC map of shape ``(m * k, n)`` from raw indices of shape ``(n, m, h)``.

    Repeated indices of one candidate in one cohort count once (Bloom OR).
    """
    n, m_given, h = indices.shape
    if m_given != m:
        raise ParameterError("map", f"indices cover {m_given} cohorts; the parameters say m={m}")
    wide = np.dtype(np.int32 if m * k < 2**31 else np.int64)  # half the memory of 64-bit rows
    offsets: np.ndarray = np.arange(m, dtype=wide) * k
    rows = (indices.astype(wide) + offsets[None, :, None]).reshape(n, m * h)
    rows.sort(axis=1)
    keep = np.ones_like(rows, dtype=bool)
    keep[:, 1:] = rows[:, 1:] != rows[:, :-1]
    counts = keep.sum(axis=1)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    row_index = rows[keep]
    index_dtype = np.int32 if m * k < 2**31 and indptr[-1] < 2**31 else np.int64
    matrix = sp.csc_matrix(
        (np.ones(row_index.size), row_index.astype(index_dtype), indptr.astype(index_dtype)),
        shape=(m * k, n),
    )
    matrix.has_sorted_indices = True
    return matrix


def build_map(
    params: StringParams, candidates: Sequence[str], progress: bool | None = None
) -> sp.csc_matrix:
    """The candidate map for ``candidates`` under ``params`` (CSC, ``m*k`` x ``n``)."""
    if not isinstance(params, StringParams):
        raise ParameterError("params", "a candidate map needs StringParams (k, h, m)")
    return indices_to_map(bloom_index_array(params, candidates, progress), params.k, params.m)


@functools.lru_cache(maxsize=1)
def remembered_map(
    params: StringParams, candidates: tuple[str, ...], progress: bool | None = None
) -> sp.csc_matrix:
    """:func:`build_map`, remembering the last map built: decoding a range and then each of
    its days (``veil decode --by day``) hashes every candidate once. The map is shared
    between its callers, who must not change it."""
    return build_map(params, candidates, progress)


def read_candidates(path: str | Path) -> list[str]:
    """Candidate strings from a UTF-8 text file, one per line.

    Line endings (LF or CRLF) are stripped, nothing else: spaces and other
    characters are part of a value. Blank lines are skipped and repeated
    candidates kept once, in first-seen order. A UTF-8 byte order mark at the start
    (Excel's "CSV UTF-8") is not part of the first candidate.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise ParameterError("candidates", f"cannot read candidates file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ParameterError(
            "candidates", f"candidates file {path} is not UTF-8 (byte {exc.start})"
        ) from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    unique = list(dict.fromkeys(line for line in lines if line))
    if not unique:
        raise ParameterError("candidates", f"candidates file {path} lists no candidate strings")
    return unique


def read_map(
    source: PathOrFile, params: StringParams, params_name: str = "params"
) -> tuple[list[str], sp.csc_matrix]:
    """Parse ``map.csv`` into candidates and a 0/1 CSC map of shape ``(m*k, n)``.

    Each line names a candidate and lists from 1 to ``h`` different indices in each of the
    ``m`` cohorts (at most ``m*h`` indices in all, repeats included): a line that does
    not, an index outside ``1..m*k``, an empty or repeated candidate and a quote never
    closed are refused, naming the line. A file of plain rows (no quotes; indices of
    digits and commas only) is parsed in bulk by NumPy, which keeps 100,000 candidates
    within a few hundred MB; any other file goes through the CSV reader row by row.
    """
    name = str(source) if isinstance(source, str | Path) else str(getattr(source, "name", "<map>"))
    parsed = _read_plain_map(source) if isinstance(source, str | Path) else None
    if parsed is None:
        parsed = _read_csv_map(source, name)
    candidates, per_line, flat, line_of = parsed
    del parsed
    if not candidates:
        raise ParameterError("map", f"{name}: the file lists no candidates")
    lines = _MapLines(name, candidates, line_of)
    size = params.m * params.k
    _check_map_indices(lines, params, params_name, per_line, flat)
    _check_unique(lines)
    keys = _line_keys(per_line, flat, size)
    del flat
    # one sort of (line, index) keys: each line's indices sorted, repeats (Bloom OR) once
    keys.sort()  # np.unique hashes, far slower at millions of keys
    if keys.size:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    _check_cohorts(lines, params, params_name, per_line, keys)
    rows = keys % size
    # each line's keys start at line * size: no array of lines needed
    indptr = np.searchsorted(keys, np.arange(len(candidates) + 1, dtype=keys.dtype) * size)
    del keys
    index_dtype = np.int32 if size < 2**31 and indptr[-1] < 2**31 else np.int64
    matrix = sp.csc_matrix(
        (np.ones(rows.size), rows.astype(index_dtype, copy=False),
         indptr.astype(index_dtype)),
        shape=(size, len(candidates)),
    )
    matrix.has_sorted_indices = True
    return candidates, matrix


class MapRows(NamedTuple):
    """A map file's candidates, how many indices each line lists, all indices in line
    order, and the file line of each candidate (``line_of(i)`` for candidate ``i`` from 0:
    blank lines and quoted line breaks move it)."""

    candidates: list[str]
    per_line: np.ndarray
    flat: np.ndarray
    line_of: Callable[[int], int]


@dataclasses.dataclass(frozen=True)
class _MapLines:
    """Names a map file's lines in errors: its name, candidates and their lines."""

    name: str
    candidates: list[str]
    line_of: Callable[[int], int]

    def line(self, index: int) -> str:
        """``map.csv line N (candidate 'x')`` for candidate ``index`` (from 0)."""
        return (f"{self.name} line {self.line_of(index)} "
                f"(candidate {self.candidates[index]!r})")


#: a UTF-8 byte order mark (Excel's "CSV UTF-8" starts with one)
BOM = b"\xef\xbb\xbf"


def _read_plain_map(path: str | Path) -> MapRows | None:
    """``map.csv`` read in bulk, or ``None`` when a row needs the CSV reader (quotes,
    spaces or other characters among the indices, an empty candidate, a candidate that is
    not UTF-8).

    Lines whose fields are all blank are skipped; empty index fields are ignored.
    """
    candidates: list[str] = []
    per_line: list[int] = []
    rests: list[bytes] = []
    skipped: list[int] = []  # the number of candidates before each skipped line
    try:
        with open(path, "rb") as handle:
            if handle.read(len(BOM)) != BOM:
                handle.seek(0)
            for raw in handle:
                line = raw[:-1] if raw.endswith(b"\n") else raw
                line = line[:-1] if line.endswith(b"\r") else line
                if b'"' in line or b"\r" in line:
                    return None
                if not line.replace(b",", b"").strip():
                    skipped.append(len(candidates))
                    continue
                candidate, _, rest = line.partition(b",")
                if not candidate or rest.translate(None, b"0123456789,"):
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
    return MapRows(candidates, counts, flat, functools.partial(_line_past_blanks, skipped))


def _line_past_blanks(skipped: list[int], index: int) -> int:
    """The file line of candidate ``index`` (from 0) when the lines ``skipped`` (each
    given as the number of candidates before it) hold none."""
    return index + 1 + bisect.bisect_right(skipped, index)


def _read_csv_map(source: PathOrFile, name: str) -> MapRows:
    """``map.csv`` through the CSV reader, one row at a time."""
    candidates: list[str] = []
    row_index: list[np.ndarray] = []
    starts: list[int] = []
    try:
        with (
            open(source, newline="", encoding="utf-8-sig") if isinstance(source, str | Path)
            else nullcontext(source)
        ) as handle:
            for line, row in csv_records(without_bom(handle), name, "map"):
                if not any(cell.strip() for cell in row):
                    continue
                if not row[0]:
                    raise ParameterError(
                        "map", f"{name} line {line}: the candidate is empty (each line names "
                               f"a candidate, then lists its indices)")
                candidates.append(row[0])
                starts.append(line)
                try:
                    row_index.append(
                        np.array([int(cell) for cell in row[1:] if cell.strip()], dtype=np.int64)
                    )
                except (ValueError, OverflowError):
                    raise ParameterError("map", _bad_index(name, line, row)) from None
    except OSError as exc:
        raise ParameterError("map", f"cannot read map file {name}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ParameterError("map", f"{name}: not UTF-8 text (byte {exc.start})") from None
    counts = np.array([r.size for r in row_index], dtype=np.int64)
    flat = np.concatenate(row_index) if row_index else np.zeros(0, dtype=np.int64)
    return MapRows(candidates, counts, flat, lambda index: starts[index])


def _bad_index(name: str, line: int, row: list[str]) -> str:
    """Which field of a map line is no index (a whole number that fits 64 bits)."""
    for field, cell in enumerate(row[1:], 2):
        try:
            if not cell.strip() or abs(int(cell)) < 2**63:
                continue
        except ValueError:
            pass
        return (f"{name} line {line} (candidate {row[0]!r}), field {field}: {cell.strip()!r} "
                f"is not an index (a whole number from 1 to m*k)")
    return f"{name} line {line} (candidate {row[0]!r}): indices must be whole numbers"


def _check_map_indices(
    lines: _MapLines, params: StringParams, params_name: str, per_line: np.ndarray,
    flat: np.ndarray,
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
    if too_many[first]:
        raise ParameterError(
            "map",
            f"{lines.line(first)} has {per_line[first]} indices but {params_name} says "
            f"m*h = {params.m}*{params.h} = {params.m * params.h}",
        )
    indices = flat[ends[first] - per_line[first]: ends[first]]
    outside = int(indices.max() if indices.max() > size else indices.min())
    raise ParameterError(
        "map",
        f"{lines.line(first)}: index {outside} is outside 1..m*k = 1..{size} "
        f"({params_name}: m={params.m}, k={params.k})",
    )


def _check_unique(lines: _MapLines) -> None:
    """Each candidate on one line only; the error names the first repeat and its line."""
    candidates = lines.candidates
    if len(set(candidates)) == len(candidates):
        return
    first: dict[str, int] = {}
    for index, candidate in enumerate(candidates):
        if candidate in first:
            raise ParameterError(
                "map", f"{lines.name} line {lines.line_of(index)}: candidate {candidate!r} is "
                       f"listed twice (first on line {lines.line_of(first[candidate])})")
        first[candidate] = index


def _line_keys(per_line: np.ndarray, flat: np.ndarray, size: int) -> np.ndarray:
    """``line * size + index - 1`` for every index of every line (indices checked: within
    ``1..size``), in the narrowest integer type that holds them all."""
    key_dtype = np.int32 if len(per_line) * size < 2**31 else np.int64
    keys: np.ndarray = np.repeat(np.arange(len(per_line), dtype=key_dtype), per_line)
    keys *= size
    keys += flat.astype(key_dtype, copy=False)
    keys -= 1
    return keys


def _check_cohorts(
    lines: _MapLines, params: StringParams, params_name: str, per_line: np.ndarray,
    keys: np.ndarray,
) -> None:
    """Every line lists 1 to ``h`` different indices in each cohort; the error names the
    first line that does not, and the cohort.

    ``keys`` are the sorted ``line * m*k + index - 1`` without repeats, so ``keys // k``
    is ``line * m + cohort``, in order: a group missing or longer than ``h`` is found with
    two comparisons of neighbours (no array per line and cohort)."""
    k, h, m = params.k, params.h, params.m
    groups = keys // k
    expected = len(lines.candidates) * m
    distinct = int(np.count_nonzero(groups[1:] != groups[:-1])) + 1 if groups.size else 0
    crowded = bool(np.any(groups[h:] == groups[:-h]))
    if distinct == expected and not crowded:
        return
    missing = crowd = expected
    if distinct != expected:
        present = groups[np.concatenate(([True], groups[1:] != groups[:-1]))[:groups.size]]
        gaps = np.flatnonzero(present != np.arange(present.size))
        missing = int(gaps[0]) if gaps.size else present.size
    if crowded:
        crowd = int(groups[:-h][groups[h:] == groups[:-h]][0])
    index, cohort = divmod(min(missing, crowd), m)
    where = f"{lines.line(index)}"
    span = f"cohort {cohort} (indices {cohort * k + 1}..{(cohort + 1) * k})"
    rule = f"a candidate sets 1 to h={h} bits in each of the m={m} cohorts ({params_name})"
    if crowd < missing:
        found = int(np.count_nonzero(groups == crowd))
        raise ParameterError(
            "map", f"{where} lists {found} different indices in {span}, but {rule}: was the "
                   f"map made with more hashes than h={h}?")
    if per_line[index] == 0:
        raise ParameterError("map", f"{where} lists no index: {rule}")
    line_keys = keys[(groups >= index * m) & (groups < (index + 1) * m)]
    last = int(line_keys.max()) % (m * k) + 1
    hint = (f"; its indices stop at {last}: was the map made for fewer cohorts than m={m}?"
            if last <= cohort * k else "")
    raise ParameterError("map", f"{where} lists no index in {span}: {rule}{hint}")


def write_map(
    params: StringParams,
    candidates: Sequence[str],
    target: PathOrFile,
    progress: bool | None = None,
) -> None:
    """Write ``map.csv`` for ``candidates`` hashed as ``params.hashing`` says (all ``m*h``
    indices): with ``md5-google``, the bytes google/rappor's ``hash_candidates.py`` writes
    apart from line endings (LF here, CRLF there; google/rappor reads either)."""
    indices = bloom_index_array(params, candidates, progress)
    offsets = (np.arange(params.m, dtype=np.int64) * params.k)[None, :, None]
    one_based = (indices + offsets + 1).reshape(len(candidates), -1)
    handle, close = open_output(target)
    try:
        writer = csv.writer(handle, lineterminator="\n")
        for candidate, row in zip(candidates, one_based.tolist(), strict=True):
            writer.writerow([candidate, *row])
    finally:
        if close:
            handle.close()


def _show_progress(progress: bool | None, work: int) -> bool:
    if progress is not None:
        return progress
    return work >= 200_000 and sys.stderr.isatty()
