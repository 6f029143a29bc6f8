#!/usr/bin/env bash
# google/rappor's association cases through `veil assoc`, scored beside Google's figures.
#
# Usage: benchmarks/assoc_cases.sh CASES_DIR OUT_DIR [--million]
#
# CASES_DIR holds the cases' kit: cases.txt (a name, then gen_assoc_case.py arguments,
# per line), gen_assoc_case.py (writes a case's files byte for byte), score_assoc.py and
# google_figures.json (google/rappor's decode_assoc.R on the same files, with its C++ EM).
# For each case this generates the files into OUT_DIR/<case>/input, runs `veil assoc` under
# /usr/bin/time -v (wall seconds and peak RSS), writes OUT_DIR/<case>/veil/metrics.json for
# the scorer, and prints Veil's scores beside Google's. --million adds case a at 1,000,000
# clients, whose Google figures (179 s, 2.8 GB with the C++ EM) come from issue 28, not
# from google_figures.json. The load average is printed with every run: compare ratios
# measured in one sitting.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 CASES_DIR OUT_DIR [--million]" >&2
    exit 2
fi
cases_dir="$(cd "$1" && pwd)"
out_dir="$2"
million="${3:-}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
python="${PYTHON:-python3}"
veil="${VEIL:-veil}"

case_lines() {
    grep -v '^[[:space:]]*#' "$cases_dir/cases.txt" | grep -v '^[[:space:]]*$'
    if [ "$million" = "--million" ]; then
        grep '^a-' "$cases_dir/cases.txt" | head -1 \
            | sed -e 's/^a-strbool-n100k-k8/a-strbool-n1m-k8/' \
                  -e 's/--num-clients[[:space:]]*100000/--num-clients 1000000/'
    fi
}

run_case() {
    local name="$1"; shift
    local input="$out_dir/$name/input" output="$out_dir/$name/veil"
    mkdir -p "$input" "$output"
    "$python" "$cases_dir/gen_assoc_case.py" "$@" --quiet --out "$input"
    local maps=(--map1 "$input/x_map.csv")
    if [ -f "$input/y_map.csv" ]; then maps+=(--map2 "$input/y_map.csv"); fi
    local load
    load="$(cut -d' ' -f1-3 /proc/loadavg)"
    /usr/bin/time -v "$veil" assoc --metric-name m --schema "$input/rappor-vars.csv" \
        --params-dir "$input" --reports "$input/reports.csv" --var1 x --var2 y \
        "${maps[@]}" --output-dir "$output" > "$output/stdout.txt" 2> "$output/time.txt"
    "$python" - "$output" "$load" <<'EOF'
import json, re, sys
output, load = sys.argv[1], sys.argv[2]
text = open(f"{output}/time.txt").read()
wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", text)
hours, minutes, seconds = (float(g or 0) for g in wall.groups())
fit = json.load(open(f"{output}/assoc-metrics.json"))
json.dump({
    "driver": "veil assoc", "load_average": load,
    "wall_seconds": hours * 3600 + minutes * 60 + seconds,
    "max_rss_kb": int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)),
    "num_em_iters": fit["num_em_iters"], "em_elapsed_time": fit["em_elapsed_time"],
    "em_implementation": "veil.server.analysis.assoc_em (SQUAREM)",
    "exit_status": 0,
}, open(f"{output}/metrics.json", "w"), indent=1)
EOF
    "$python" "$cases_dir/score_assoc.py" "$input" "$output" > "$output/score.json"
}

while read -r name args; do
    # shellcheck disable=SC2086  # the case's arguments are words
    run_case "$name" $args
done < <(case_lines)

"$python" - "$cases_dir" "$out_dir" <<'EOF'
import json, os, sys
cases_dir, out_dir = sys.argv[1], sys.argv[2]
google = json.load(open(os.path.join(cases_dir, "google_figures.json")))
runs = {r["case"]: r for r in google["runs"] if r["settings"] == "ASSOC_EM=cpp"}
runs["a-strbool-n1m-k8"] = {"total_variation": None, "wall_seconds": 179.0,
                            "max_rss_kb": 2.8e6, "num_x_detected": None}
fields = [("total_variation", "TV", "{:.3f}"), ("num_x_detected", "x found", "{}"),
          ("wall_seconds", "wall s", "{:.2f}"), ("max_rss_kb", "peak MB", "{:.0f}")]
print(f"{'case':22} {'who':7} " + " ".join(f"{label:>8}" for _, label, _ in fields)
      + "  TV/Google  Google/Veil wall  load")
for name in sorted(os.listdir(out_dir)):
    path = os.path.join(out_dir, name, "veil", "score.json")
    if not os.path.exists(path):
        continue
    veil, them = json.load(open(path)), runs.get(name, {})
    veil["load_average"] = json.load(open(os.path.join(out_dir, name, "veil", "metrics.json")))[
        "load_average"]
    for who, row in (("veil", veil), ("google", them)):
        cells = []
        for key, _, form in fields:
            value = row.get(key)
            if key == "max_rss_kb" and value is not None:
                value = value / 1024
            cells.append(f"{'-' if value is None else form.format(value):>8}")
        extra = ""
        if who == "veil":
            tv = them.get("total_variation")
            ratio = f"{veil['total_variation'] / tv:.2f}" if tv else "-"
            speed = them.get("wall_seconds")
            extra = (f"  {ratio:>9}  {speed / veil['wall_seconds'] if speed else 0:>16.1f}"
                     f"  {veil.get('load_average', '')}")
        print(f"{name:22} {who:7} " + " ".join(cells) + extra)
EOF
