"""True positives at google/rappor's number of false positives, from ``veil decode --all``.

Usage: ``python benchmarks/rappor_scores.py CASE_DIR RESULTS_CSV GOOGLE_FIGURES_JSON``

``CASE_DIR/truth.csv`` (header ``value,count,proportion``) holds a case's true values,
``RESULTS_CSV`` is ``veil decode --all`` output (every candidate, ranked by ``rank``) and
the figures file gives google/rappor's decoder's ``num_detected`` and ``num_false_pos``
for the case (keyed by the case directory's name). Walking Veil's ranking from the top,
it counts the true strings met before the first false positive past Google's number:
the true positives Veil has at Google's false positives, the equal footing for comparing
recall. Prints one JSON line with both and Veil's own detections (``detected`` = 1).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def true_values(case: Path) -> set[str]:
    """The values that occur in the case's truth."""
    with open(case / "truth.csv", newline="", encoding="utf-8") as handle:
        return {row["value"] for row in csv.DictReader(handle) if int(row["count"]) > 0}


def score(case: Path, results: Path, google: dict[str, int]) -> dict[str, object]:
    """Veil's true positives at Google's false positives, beside both sides' figures."""
    truth = true_values(case)
    with open(results, newline="", encoding="utf-8") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["rank"]))
    allowed = google["num_false_pos"]
    hits = false = 0
    for row in rows:
        if row["string"] in truth:
            hits += 1
        else:
            false += 1
            if false > allowed:
                break
    detected = [row["string"] for row in rows if row["detected"] == "1"]
    return {
        "case": case.name,
        "google_tp": google["num_detected"] - allowed,
        "google_fp": allowed,
        "veil_tp_at_google_fp": hits,
        "veil_detected_tp": sum(value in truth for value in detected),
        "veil_detected_fp": sum(value not in truth for value in detected),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write(__doc__ or "")
        return 2
    case, results = Path(argv[1]), Path(argv[2])
    figures = json.loads(Path(argv[3]).read_text(encoding="utf-8"))
    print(json.dumps(score(case, results, figures[case.name])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
