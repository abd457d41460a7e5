"""docs/benchmark.md's rows from the benchmark sweeps.

The quick protocol: accuracy over the seeds of one sweep, seconds per round from a second, timing-only
sweep of seed 0 run alone on a quiet machine.

    python scripts/sweep.py --config scripts/benchmark_zoo.json                                   # 3 seeds
    python scripts/sweep.py --config scripts/benchmark_zoo.json --seeds 0 --out results/benchmark_timing
    python scripts/benchmark_report.py                                                            # rows -> doc

Accuracies are deterministic (the same seed gives the same curve on any executor), so the timing sweep's
seed 0 must reproduce the accuracy sweep's seed 0 exactly: every row is checked, and a mismatch is an
error. Seconds per round are wall time, which other processes on the machine inflate; the accuracy sweep
may share the machine, the timing sweep should not. The rows replace the block between
``<!-- rows:begin -->`` and ``<!-- rows:end -->`` of the document.

Protocol B, converged (``--protocol converged``):

    python scripts/sweep.py --config scripts/benchmark_converged.json -j 2   # both splits, 3 seeds
    python scripts/benchmark_report.py --protocol converged                  # export, rows, figures

reads the sweep's results, writes a compact export of every run (``docs/benchmarks/converged.json``: per
split and algorithm the command, and per seed the accuracy curve, bytes, seconds per round and the code's
commit; what every table cell and figure is drawn from, so a reader can redraw any curve without the h5
files), then from the export alone: the two tables (best and last accuracy, PFLlib's published leaderboard
value beside every algorithm it has, ``docs/benchmarks/pfllib_leaderboard.json``), the flatness check, the
Spearman rank correlation with PFLlib's ordering, and the figures (curves of the traditional and the
personalised groups with ±1 std bands, this library's ranks against PFLlib's). ``--export-only`` /
``--from-export`` split the two halves. Each table replaces the block between ``<!-- converged-<split>:begin
-->`` and its ``end`` marker.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "system"))
sys.path.insert(0, str(REPO / "scripts"))

import table  # noqa: E402

BEGIN, END = "<!-- rows:begin -->", "<!-- rows:end -->"
EXPORT = REPO / "docs" / "benchmarks" / "converged.json"
LEADERBOARD = REPO / "docs" / "benchmarks" / "pfllib_leaderboard.json"
SPLITS = {"FMNIST_pat_s2000": "pat", "FMNIST_dir0.1_s2000": "dir"}  # Protocol B's splits -> leaderboard column
# The traditional-FL group of the figures (evaluated on the global model); every other algorithm is personalised.
TRADITIONAL = ("FedAvg", "FedProx", "SCAFFOLD", "FedDyn", "MOON", "FedLC", "FedGen", "FedNTD", "FedCross")
FLAT_PT, FLAT_TAIL, FLAT_TOP = 0.5, 0.2, 5  # the flatness criterion: see flatness()


def seed0_curve(row: table.Row) -> np.ndarray | None:
    for run in row.runs:
        if run.meta.get("run") == 0:
            return np.asarray(run.series["rs_test_acc"])
    return None


def mean_mb(row: table.Row, key: str) -> float:
    """Megabytes per round of one direction (``rs_bytes_up`` or ``rs_bytes_down``), summed over the clients,
    averaged over rounds and seeds."""
    per_run = [np.mean(run.series[key]) for run in row.runs if len(run.series.get(key, ())) > 0]
    return float(np.mean(per_run)) / 1e6 if per_run else float("nan")


def rows_markdown(acc_rows: list[table.Row], time_rows: dict[str, table.Row]) -> tuple[str, list[str]]:
    """The markdown table and the problems found (missing timing, seed 0 not reproduced)."""
    problems = []
    best_cols = {c: table.best_rows(acc_rows, c) for c in ("best", "last")}
    lines = ["| algorithm | best accuracy (%) | last accuracy (%) | MB/round up / down | s/round | seeds |",
             "|---|---|---|---|---|---|"]
    for i, row in enumerate(acc_rows):
        name = row.group[0]
        cells = []
        for col in ("best", "last"):
            text = table.cell(row.stats[col], col)
            cells.append(f"**{text}**" if i in best_cols[col] else text)
        up, down = (mean_mb(row, key) for key in ("rs_bytes_up", "rs_bytes_down"))
        cells.append(f"{up:.2f} / {down:.2f}" if np.isfinite(up + down) else "-")
        timed = time_rows.get(name)
        if timed is None:
            problems.append(f"{name}: no timing run")
            cells.append("-")
        else:
            a, b = seed0_curve(row), seed0_curve(timed)
            if a is None or b is None or not np.array_equal(a, b):
                problems.append(f"{name}: the timing run's seed 0 does not reproduce the accuracy run's curve")
            cells.append(f"{timed.stats['time'][0]:.2f}")
        cells.append(str(row.stats["best"][3]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines), problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(REPO / "results" / "benchmark"), help="the accuracy sweep's folder")
    p.add_argument("--timing", default=str(REPO / "results" / "benchmark_timing"), help="the timing sweep's folder")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmark.md")
    p.add_argument("--print", action="store_true", help="print the rows instead of writing the document")
    args = p.parse_args(argv)
    try:
        acc_rows = table.aggregate(table.load_runs([args.results]), ["algorithm"])
        time_rows = {r.group[0]: r for r in table.aggregate(table.load_runs([args.timing]), ["algorithm"])}
    except table.TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in table.check_rows(acc_rows, ["algorithm"]):
        print(f"warning: {w}", file=sys.stderr)
    text, problems = rows_markdown(acc_rows, time_rows)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if args.print:
        print(text)
    else:
        doc = args.doc.read_text()
        if BEGIN not in doc or END not in doc:
            print(f"error: {args.doc} lacks the {BEGIN} / {END} markers", file=sys.stderr)
            return 2
        head, rest = doc.split(BEGIN, 1)
        args.doc.write_text(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])
        print(f"wrote {len(acc_rows)} rows to {args.doc}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
