"""docs/robustness.md's table from the robustness sweep, through a compact export of every run.

    python scripts/sweep.py --config scripts/robustness.json -j 1          # resumable; --seeds 0 first
    python scripts/robustness_report.py                                    # export + table -> doc
    python scripts/robustness_report.py --from-export --print              # the table from the export alone

The export (``docs/benchmarks/robustness.json``) holds per run its algorithm, attack, aggregator and seed,
the benign clients' and all clients' accuracy per evaluation, the malicious clients and the CPU seconds the
sweep recorded; runs found in ``--results`` replace the same (algorithm, attack, aggregator, seed) and every
other entry is kept, so the table grows over several sweeps. A cell is the mean ± std (population std)
over the seeds of the benign clients' accuracy at the last round (every client's without an attack), in %;
a cell of one seed is its value alone (no spread), a cell with fewer finished seeds than the others says
how many, a run that diverged (its training loss became NaN or inf) is counted in its cell ("2 diverged", or
"diverged" when every seed did), and a cell not run is "-". The table replaces the block between
``<!-- robustness:begin -->`` and ``<!-- robustness:end -->``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "system"))
sys.path.insert(0, str(REPO / "scripts"))

from benchmark_report import write_block  # noqa: E402

from utils.results import read_h5  # noqa: E402
from utils.robust import RULES  # noqa: E402

EXPORT = REPO / "docs" / "benchmarks" / "robustness.json"
ATTACKS = ("none", "signflip", "gaussian", "labelflip", "scaled")
ALGOS = ("FedAvg", "FedAvgM", "FedALA", "Ditto", "FedRep")


def key(entry: dict) -> tuple:
    return entry["algorithm"], entry["attack"], entry["aggregator"], entry["seed"]


def read_results(folder: Path) -> list[dict]:
    """Every finished or diverged run of the sweep folder as an export entry (``status``)."""
    out = []
    for side in sorted(folder.glob("*.json")):
        meta = json.loads(side.read_text())
        if meta.get("status") not in ("finished", "diverged"):
            continue
        cfg = meta["config"]
        series = read_h5(side.with_suffix(".h5"))
        benign = series.get("rs_benign_test_acc", series["rs_test_acc"])
        cpu = folder / "logs" / f"{side.stem}.cpu.json"
        out.append({"algorithm": meta["label"], "attack": cfg.get("attack") or "none", "aggregator": cfg["aggregator"],
                    "seed": meta["seed"], "status": meta["status"], "benign_acc": [round(float(a), 6) for a in benign],
                    "all_acc": [round(float(a), 6) for a in series["rs_test_acc"]],
                    "malicious_clients": meta.get("malicious_clients", []),
                    "cpu_s": json.loads(cpu.read_text())["cpu_s"] if cpu.exists() else None})
    return out


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    entries = {key(e): e for e in old} | {key(e): e for e in new}
    return [entries[k] for k in sorted(entries, key=lambda k: (k[0], k[1], k[2], k[3]))]


def markdown(entries: list[dict]) -> str:
    """One row per (algorithm, attack), one column per aggregator (see the module docstring)."""
    cells: dict[tuple, list[float]] = {}
    diverged: dict[tuple, int] = {}
    for e in entries:
        cell = (e["algorithm"], e["attack"], e["aggregator"])
        if e.get("status", "finished") == "diverged":
            diverged[cell] = diverged.get(cell, 0) + 1
        else:
            cells.setdefault(cell, []).append(100 * e["benign_acc"][-1])
    most = max((len(v) + diverged.get(c, 0) for c, v in cells.items()), default=0)
    lines = ["| algorithm | attack | " + " | ".join(RULES) + " |", "|---|---|" + "---|" * len(RULES)]
    for algo in ALGOS:
        for attack in ATTACKS:
            row = []
            for rule in RULES:
                v, lost = cells.get((algo, attack, rule), []), diverged.get((algo, attack, rule), 0)
                if not v:
                    row.append("diverged" if lost else "-")
                    continue
                text = f"{v[0]:.1f}" if len(v) == 1 else f"{np.mean(v):.1f} ± {np.std(v):.1f}"
                notes = [f"{len(v)}"] if len(v) + lost < most else []
                notes += [f"{lost} diverged"] if lost else []
                row.append(text + (f" ({', '.join(notes)})" if notes else ""))
            if any(c != "-" for c in row):
                lines.append(f"| {algo} | {attack} | " + " | ".join(row) + " |")
    cpu = sum(e["cpu_s"] or 0.0 for e in entries)
    seeds = sorted({e["seed"] for e in entries})
    lines.append("")
    lost = sum(diverged.values())
    lines.append(f"{len(entries)} runs (seeds {', '.join(map(str, seeds))}; {lost} diverged), {cpu / 3600:.2f} "
                 f"CPU-hours as the sweep recorded them.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "results" / "robustness", help="the sweep's folder")
    p.add_argument("--export", type=Path, default=EXPORT)
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "robustness.md")
    p.add_argument("--from-export", action="store_true", help="the table from the export alone")
    p.add_argument("--print", action="store_true", help="print the table instead of writing the document")
    args = p.parse_args(argv)
    old = json.loads(args.export.read_text())["runs"] if args.export.exists() else []
    entries = old if args.from_export else merge(old, read_results(args.results))
    if not args.from_export:
        args.export.write_text('{"runs": [\n' + ",\n".join(json.dumps(e) for e in entries) + "\n]}\n")  # a run a line
    text = markdown(entries)
    if args.print:
        print(text)
    else:
        write_block(args.doc, "robustness", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
