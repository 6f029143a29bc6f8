"""The candidate map: which Bloom bits each candidate string sets in each cohort.

Row ``c * k + bit`` of the map is bit ``bit`` of cohort ``c``; column ``s`` is
candidate ``s``. A candidate sets at most ``h`` bits per cohort (fewer when two
of its hashes collide: the Bloom filter is an OR). The hashing is exactly
:func:`veil.shared.hashing.bloom_indices` with the parameters' ``hashing`` (all cohorts at
once: :func:`~veil.shared.hashing.bloom_indices_all_cohorts`), the
function the client encodes with.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

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
    candidates kept once, in first-seen order.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
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


def _show_progress(progress: bool | None, work: int) -> bool:
    if progress is not None:
        return progress
    return work >= 200_000 and sys.stderr.isatty()
