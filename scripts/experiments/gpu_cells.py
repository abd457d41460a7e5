"""The time-limited cells of ``scripts/experiments/gpu_check.sh`` side by side, at equal rounds.

    python scripts/experiments/gpu_cells.py results/gpu_check                        # one markdown table per dataset
    python scripts/experiments/gpu_cells.py results/gpu_check --rounds 1,4,9 --json docs/benchmarks/gpu_cells.json

Each cell ran for the same wall time, so each reached the rounds its cost allowed; a cell's accuracy is
therefore compared with another's at the same round, never at its last. Per dataset, one row per cell: its
test accuracy (%) after each round of ``--rounds`` ("-" where it did not get there), the rounds it reached,
its best accuracy over them and its seconds per round. Reads the runs of goal ``gpu-cell`` (complete or
not); ``--json`` also writes every cell's curve.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from scripts.run import table  # noqa: E402
from utils import fileio  # noqa: E402


def cell(run) -> dict:
    """One cell: its curve (round -> accuracy in %), the rounds it reached, its best accuracy and mean seconds
    per round (``table.run_metrics``'s, as every table of the project reports them)."""
    rounds = [int(r) for r in run.series["rs_round"]]
    metrics = table.run_metrics(run, None)
    return {"dataset": run.config["dataset"], "algorithm": run.key("algorithm"), "rounds": rounds,
            "acc": [100 * float(a) for a in run.series["rs_test_acc"]], "reached": rounds[-1], "best": metrics["best"],
            "s_per_round": None if math.isnan(metrics["time"]) else metrics["time"]}


def render(dataset: str, cells: list[dict], at: list[int]) -> str:
    lines = [f"### {dataset}", "",
             "| algorithm | " + " | ".join(f"acc after round {r} (%)" for r in at)
             + " | rounds reached | best (%) | s/round |",
             "| --- |" + " --- |" * (len(at) + 3)]
    for c in cells:
        curve = dict(zip(c["rounds"], c["acc"]))
        values = [f"{curve[r]:.2f}" if r in curve else "-" for r in at]
        time = f"{c['s_per_round']:.2f}" if c["s_per_round"] is not None else "-"
        lines.append(f"| {c['algorithm']} | " + " | ".join(values) + f" | {c['reached']} | {c['best']:.2f} | {time} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="the results folder of scripts/experiments/gpu_check.sh")
    p.add_argument("--rounds", default="1,5,10,20", help="rounds to compare the cells at (comma-separated)")
    p.add_argument("--json", type=Path, default=None, help="also write every cell's curve to this JSON file")
    args = p.parse_args(argv)
    try:
        at = [int(r) for r in args.rounds.split(",")]
        runs = [r for r in table.load_runs([args.folder], incomplete=True)
                if r.config.get("goal") == "gpu-cell" and len(r.series.get("rs_round", []))]
    except ValueError:
        print(f"error: --rounds {args.rounds}: expected comma-separated integers", file=sys.stderr)
        return 2
    except table.TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: no gpu-cell runs with evaluations in {args.folder}", file=sys.stderr)
        return 2
    cells = sorted((cell(r) for r in runs), key=lambda c: (c["dataset"], c["algorithm"]))
    for dataset in sorted({c["dataset"] for c in cells}):
        print(render(dataset, [c for c in cells if c["dataset"] == dataset], at))
    if args.json is not None:
        fileio.write_file(args.json, json.dumps({"cells": cells}, indent=1) + "\n", "--json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
