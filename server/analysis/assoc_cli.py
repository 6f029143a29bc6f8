"""``veil assoc``: the joint table of two variables from google/rappor's association files.

The options are those of google/rappor's ``bin/decode_assoc.R`` (``--metric-name``,
``--schema``, ``--params-dir``, ``--reports``, ``--var1``, ``--var2``, ``--map1``,
``--map2``, ``--output-dir``); any pair of string and boolean variables is accepted. The
output directory gets ``assoc-results.csv`` (google/rappor's columns, the two variables
and ``proportion``, then ``prop_std_error``, ``prop_low_95`` and ``prop_high_95``) and
``assoc-metrics.json`` (the fit: reports, groups, cycles, convergence, seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.shared.errors import ParameterError

if TYPE_CHECKING:
    from veil.server.analysis.assoc_em import JointEM
    from veil.server.analysis.assoc_files import AssocInputs

#: the normal quantile of the two-sided 95% intervals
Z_95 = 1.959963984540054


def run_assoc(args: argparse.Namespace) -> int:
    """Read the files, fit the joint table and write ``assoc-results.csv``."""
    from veil.server.analysis.assoc_em import JointEM
    from veil.server.analysis.assoc_files import read_assoc_files

    started = time.perf_counter()
    inputs = read_assoc_files(args.metric_name, args.schema, args.params_dir, args.reports,
                              args.var1, args.var2, args.map1, args.map2)
    fit = JointEM(prior_reports=args.prior_reports, max_iter=args.max_em_iters).fit(
        inputs.groups)
    out = Path(args.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ParameterError("output_dir", f"cannot create {out}: {exc.strerror}") from None
    results = out / "assoc-results.csv"
    write_assoc_results(inputs, fit, results)
    metrics = assoc_metrics(inputs, fit, time.perf_counter() - started)
    (out / "assoc-metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    first, second = inputs.first, inputs.second
    print(f"{inputs.reports:,} reports in {metrics['groups']:,} groups: "
          f"{first.name} ({len(first.values)} values) x {second.name} "
          f"({len(second.values)} values), {fit.iterations_} EM cycles"
          f"{'' if fit.converged_ else ' (NOT converged: the cycle limit was reached)'}; "
          f"wrote {results}")
    if not fit.converged_:
        print(f"warning: the EM stopped at --max-em-iters {args.max_em_iters} before "
              "converging; raise it", file=sys.stderr)
    return 0


def write_assoc_results(inputs: AssocInputs, fit: JointEM, path: Path) -> None:
    """One row per cell: the two values, the proportion, its standard error and 95% interval
    (clipped to [0, 1])."""
    from veil.server.analysis.tables import AnalystCsv

    first, second = inputs.first, inputs.second
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = AnalystCsv(handle)
        writer.writerow([first.name, second.name, "proportion", "prop_std_error",
                         "prop_low_95", "prop_high_95"])
        for i, x in enumerate(first.values):
            for j, y in enumerate(second.values):
                share, se = float(fit.table_[i, j]), float(fit.std_errors_[i, j])
                writer.writerow([x, y, share, se, max(share - Z_95 * se, 0.0),
                                 min(share + Z_95 * se, 1.0)])


def assoc_metrics(inputs: AssocInputs, fit: JointEM, seconds: float) -> dict[str, Any]:
    """``assoc-metrics.json``: google/rappor's fields and the fit's own."""
    return {
        "num_reports": inputs.reports,
        "groups": int(inputs.groups.weights.size),
        "estimate_dimensions": list(fit.table_.shape),
        "sum_estimates": float(fit.table_.sum()),
        "num_em_iters": fit.iterations_,
        "em_evaluations": fit.evaluations_,
        "converged": fit.converged_,
        "prior_reports": fit.prior_reports,
        "objective": fit.objective_[-1],
        "em_elapsed_time": fit.seconds_,
        "total_elapsed_time": seconds,
    }
