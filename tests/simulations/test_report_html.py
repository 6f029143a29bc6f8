"""An experiment's report.html reads as a page: its metrics table scrolls in its own box
instead of pushing the page sideways, its column names may wrap, and a figure's caption
says what the figure is (it used to be the bare file stem, "regression")."""

from __future__ import annotations

import math

from veil.simulations.report import Results, new_figure, write_results


def test_report_html_keeps_wide_tables_in_a_box_and_captions_figures(tmp_path) -> None:
    figure = new_figure(3, 2)
    figure.subplots().plot([0, 1], [0, 1])
    rows = [{"distribution": "zipf1", "clients": 1_000_000, "fp_rate": math.nan,
             "total_variation": 0.1234567}]
    page = (write_results(Results("regression", "a regression matrix", rows,
                                  {"regression": figure}, ["a note"]), tmp_path)
            / "report.html").read_text(encoding="utf-8")
    assert "<div class='wide'><table>" in page and ".wide{overflow-x:auto" in page
    assert "<figcaption>Figure 1: a regression matrix (also written as regression.png)" in page
    assert "<figcaption>regression</figcaption>" not in page
    assert "<th>total_<wbr>variation</th>" in page
    assert "<td>1,000,000</td>" in page and "<td>n/a</td>" in page and "<td>0.1235</td>" in page
