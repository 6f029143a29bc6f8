"""The joint-table EM over google/rappor's association inputs: it recovers a known table
within its stated standard errors, its objective never falls and it stops at its
tolerance, its standard errors match the spread over simulated samples, and its memory
follows the distinct report groups, not the reports.

The cases are made here, as google/rappor's association test data are (each client holds
a pair, both variables are RAPPOR reports of one client in one row), with Veil's own
simulation encoders and google/rappor's MD5 hashing, and written in its files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from veil.server.analysis.assoc_em import GroupedLikelihoods, JointEM, _EmSteps
from veil.server.analysis.assoc_files import BOOLEAN_VALUES, read_assoc_files
from veil.server.analysis.candidate_map import write_map
from veil.server.counts import write_params
from veil.shared.kinds import StringParams
from veil.simulations.encoding import RapporNoise, bloom_table, encode_strings


@dataclasses.dataclass(frozen=True)
class Variable:
    """A variable of a generated case: a string's candidates, or None for a boolean."""

    name: str
    candidates: list[str] | None


def _bit_strings(bits: np.ndarray) -> list[str]:
    """Report bits (column i = bit i) as google/rappor writes them: bit k-1 first."""
    return ["".join("1" if b else "0" for b in row[::-1]) for row in bits]


def _reports(params: StringParams, variable: Variable, values: np.ndarray,
             cohorts: np.ndarray, rng: np.random.Generator) -> list[str]:
    """Each client's report of ``variable`` (value indices ``values``; booleans: 0 = TRUE)."""
    if variable.candidates is None:
        truth = (values == 0).astype(np.uint64).reshape(-1, 1)  # Bloom bit 0 set for TRUE
        words = RapporNoise(1, params.p, params.q, params.f).encode(truth, None, rng)
        return _bit_strings((words & np.uint64(1)).astype(np.uint8))
    reports = encode_strings(params, bloom_table(params, variable.candidates), values,
                             cohorts, rng)
    return _bit_strings(reports.bits())


def write_case(folder: Path, params: StringParams, first: Variable, second: Variable,
               table: np.ndarray, clients: int, seed: int) -> None:
    """google/rappor's association files for ``clients`` pairs drawn from ``table``
    (rows: ``first``'s values, columns: ``second``'s; a boolean's are TRUE, FALSE)."""
    rng = np.random.default_rng(seed)
    cells = rng.choice(table.size, size=clients, p=table.reshape(-1))
    x, y = np.divmod(cells, table.shape[1])
    cohorts = np.arange(clients) % params.m
    columns = [_reports(params, first, x, cohorts, rng), _reports(params, second, y, cohorts, rng)]
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"client,cohort,{first.name},{second.name}"]
    lines += [f"c{i},{cohorts[i]},{columns[0][i]},{columns[1][i]}" for i in range(clients)]
    (folder / "reports.csv").write_text("\n".join(lines) + "\n")
    schema = ["metric,var,var_type,params"] + [
        f"m,{v.name},{'boolean' if v.candidates is None else 'string'},m_params"
        for v in (first, second)]
    (folder / "rappor-vars.csv").write_text("\n".join(schema) + "\n")
    write_params(params, folder / "m_params.csv")
    for variable in (first, second):
        if variable.candidates is not None:
            write_map(params, variable.candidates, folder / f"{variable.name}_map.csv")


def read_case(folder: Path, first: Variable, second: Variable):
    """The case's files read as ``veil assoc`` reads them."""
    maps = [folder / f"{v.name}_map.csv" if v.candidates else None for v in (first, second)]
    return read_assoc_files("m", folder / "rappor-vars.csv", folder, folder / "reports.csv",
                            first.name, second.name, *maps)


PARAMS = StringParams(k=16, h=2, m=8, p=0.25, q=0.75, f=0.0, hashing="md5-google")
STRING = Variable("x", ["apple", "banana", "carrot", "durian"])
BOOLEAN = Variable("y", None)
#: a dependent table: P(TRUE | apple) = 0.8, P(TRUE | banana) = 0.25, ...
TABLE = np.array([[0.32, 0.08], [0.05, 0.15], [0.18, 0.02], [0.06, 0.14]])


@pytest.fixture(scope="module")
def string_boolean(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("string_boolean")
    write_case(folder, PARAMS, STRING, BOOLEAN, TABLE, 20_000, seed=3)
    return read_case(folder, STRING, BOOLEAN)


def test_em_recovers_a_known_table_within_its_standard_errors(string_boolean) -> None:
    """The maximum-likelihood table is within 4 standard errors of the population table in
    every cell (standard errors from the observed Fisher information; |z| > 4 somewhere
    among 8 cells has probability about 5e-4), and most cells within 2."""
    fit = JointEM(prior_reports=0).fit(string_boolean.groups)
    assert string_boolean.first.values == STRING.candidates
    assert string_boolean.second.values == list(BOOLEAN_VALUES)
    assert fit.table_.sum() == pytest.approx(1.0)
    z = (fit.table_ - TABLE) / fit.std_errors_
    assert np.all(fit.std_errors_ > 0)
    assert np.abs(z).max() < 4.0, z
    assert np.mean(np.abs(z) < 2.0) >= 0.75, z


def test_em_objective_never_falls_and_stops_at_its_tolerance(string_boolean) -> None:
    """Each SQUAREM cycle keeps the objective from falling; the fit stops when a cycle gains
    less than ``tol`` and moves no cell more than ``cell_tol``, long before the cap; a cap
    of two cycles is reported as not converged."""
    fit = JointEM(prior_reports=30.0, tol=1e-6, cell_tol=1e-8).fit(string_boolean.groups)
    gains = np.diff(fit.objective_)
    assert np.all(gains >= -1e-9 * abs(fit.objective_[-1])), gains.min()
    assert fit.converged_ and fit.iterations_ < fit.max_iter
    assert gains[-1] < 1e-6
    capped = JointEM(prior_reports=30.0, tol=1e-6, cell_tol=1e-8, max_iter=2).fit(
        string_boolean.groups)
    assert not capped.converged_ and capped.iterations_ == 2
    # the converged table is a fixed point of the EM: one more EM step barely moves it
    step, _ = _EmSteps(string_boolean.groups, 30.0)(fit.table_)
    assert np.abs(step - fit.table_).max() < 1e-6


def test_groups_follow_distinct_reports_not_their_number(tmp_path: Path) -> None:
    """Memory is the distinct (cohort, report, report) groups: 40,000 clients of a boolean
    pair keep at most 4 groups (a boolean's likelihood does not depend on its cohort), and
    a string x boolean case keeps at most one group per distinct triple, with every report
    counted once."""
    both = (Variable("a", None), Variable("b", None))
    write_case(tmp_path / "bb", PARAMS, *both, np.array([[0.4, 0.1], [0.2, 0.3]]), 40_000, 1)
    booleans = read_case(tmp_path / "bb", *both)
    assert booleans.reports == 40_000 and booleans.groups.weights.size <= 4
    assert booleans.groups.reports == 40_000
    write_case(tmp_path / "sb", PARAMS, STRING, BOOLEAN, TABLE, 5_000, 2)
    inputs = read_case(tmp_path / "sb", STRING, BOOLEAN)
    lines = (tmp_path / "sb" / "reports.csv").read_text().splitlines()[1:]
    triples = {tuple(line.split(",")[1:]) for line in lines}
    assert inputs.groups.weights.size <= len(triples) < 5_000
    assert inputs.groups.reports == 5_000
    assert inputs.groups.first.shape[0] <= len({t[:2] for t in triples})


def test_standard_errors_match_the_spread_over_simulated_samples() -> None:
    """Over 200 simulated boolean x boolean samples of 3,000 clients, the stated standard
    error of a cell matches the spread of its estimates: the variance of the standardized
    errors is 1 within 3 of its own standard errors (sqrt(2/200) = 0.1 each), and 95%
    intervals cover 90-99% (binomial: 95% +- 3 x 1.5%)."""
    truth = np.array([[0.4, 0.1], [0.2, 0.3]])
    p_star, q_star = 0.25, 0.75
    likelihood = np.array([[1 - q_star, 1 - p_star], [q_star, p_star]])  # [report][TRUE, FALSE]
    rng = np.random.default_rng(11)
    z = []
    for _ in range(200):
        cells = rng.choice(4, size=3_000, p=truth.reshape(-1))
        truths = np.stack(np.divmod(cells, 2), axis=1) == 0
        bits = np.where(truths, rng.random(truths.shape) < q_star, rng.random(truths.shape) < p_star)
        fit = JointEM(prior_reports=0).fit(GroupedLikelihoods.of(
            likelihood, likelihood, bits[:, 0].astype(int), bits[:, 1].astype(int)))
        z.append(((fit.table_ - truth) / fit.std_errors_).reshape(-1))
    scores = np.array(z)
    assert np.var(scores[:, 0]) == pytest.approx(1.0, abs=0.3)
    assert np.var(scores[:, 3]) == pytest.approx(1.0, abs=0.3)
    assert 0.90 <= np.mean(np.abs(scores) < 1.96) <= 0.99


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_maximum_likelihood_fit_meets_its_optimality_conditions(tmp_path: Path,
                                                                    seed: int) -> None:
    """At the maximum of the likelihood on the simplex every cell's gradient
    ``sum_g w_g l_g[c] / (l_g' P) / N`` is at most 1, and 1 where the cell is positive
    (Karush-Kuhn-Tucker). An extrapolation that clipped a cell to exactly 0 left it there
    for good (no EM step lifts a 0), and the fit stopped on a table whose empty cell had
    gradient 1.13-1.20: not the maximum, reported as converged. These cases (nearly
    deterministic reports: q = 0.95, f = 0; a cell of 2%) did that before SQUAREM's step
    was halved back into the simplex."""
    params = StringParams(k=8, h=1, m=8, p=0.25, q=0.95, f=0.0, hashing="md5-google")
    first = Variable("x", ["x1", "x2", "x3", "x4", "x5"])
    # Zipf(1) strings, each TRUE with probability 0.8 or 0.2 (alternating)
    shares = 1 / np.arange(1, 6) / (1 / np.arange(1, 6)).sum()
    true_given = np.where(np.arange(5) % 2 == 0, 0.8, 0.2)
    table = np.column_stack([shares * true_given, shares * (1 - true_given)])
    write_case(tmp_path, params, first, BOOLEAN, table, 20_000, seed=seed)
    data = read_case(tmp_path, first, BOOLEAN).groups
    fit = JointEM(prior_reports=0, max_iter=5000).fit(data)
    assert fit.converged_
    steps = _EmSteps(data, 0.0)
    steps(fit.table_)  # fills steps.ratios with w_g / d_g at the fit
    gradient = np.asarray(data.first.T @ (steps.ratios @ data.second)) / data.reports
    assert gradient.max() <= 1 + 1e-3, gradient
    positive = fit.table_ > 1e-6
    np.testing.assert_allclose(gradient[positive], 1.0, atol=1e-3)
