"""docs/benchmark.md's model-heterogeneous rows, through a compact export of every run (as benchmark_report.py
does for the other protocols, whose export and table helpers it reuses).

    python scripts/sweep.py --config scripts/benchmark_hetero.json --seeds 0 -j 1     # one seed of every row
    python scripts/sweep.py --config scripts/benchmark_hetero.json -j 1               # the other seeds
    python scripts/hetero_report.py                                                   # export -> rows

The export (``docs/benchmarks/hetero.json``) holds per algorithm the reproducing command and per seed the
accuracy curve, bytes and seconds per round, the CPU seconds the sweep recorded and the code's commit. Each
row sits beside the same algorithm's quick-protocol figures with one shared model (``-m CNN`` on every
client), read from the quick protocol's export (``docs/benchmarks/quick.json``) where its runs were made on
the same split (the same config hash; "-" otherwise), and gives the CPU seconds its runs took.
The rows replace the block between ``<!-- hetero:begin -->`` and ``<!-- hetero:end -->``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import benchmark_report as report
import table

REPO = report.REPO
EXPORT = REPO / "docs" / "benchmarks" / "hetero.json"
CONFIG = "benchmark_hetero.json"


def shared_model_cells(quick: dict, data: dict) -> dict[str, tuple[str, str]]:
    """{algorithm: (best cell, last cell)} of the quick protocol with one shared model, from its export
    ``quick`` (``docs/benchmarks/quick.json``), for the algorithms whose runs there were all made on the split
    (the same config hash) of every heterogeneous run in ``data``; the others are left out (their row shows
    "-")."""
    (split, hetero), = data["splits"].items()
    hashes = {r.get("split_hash") for e in hetero.values() for r in e["runs"]}
    entries = {n: e for n, e in quick.get("splits", {}).get(split, {}).items()
               if len(hashes) == 1 and {r.get("split_hash") for r in e["runs"]} == hashes}
    cells = report.accuracy_cells({n: report.best_last(e) for n, e in entries.items()}) if entries else {}
    return {n: tuple(c.replace("**", "") for c in pair) for n, pair in cells.items()}


def hetero_markdown(data: dict, shared: dict) -> str:
    """The rows: per algorithm its best and last accuracy with different models, the same with one shared
    model, what crosses the wire, the CPU seconds of a run and its seed count; then the total."""
    from flcore.registry import get_server_class

    (split, entries), = data["splits"].items()
    names = report.ordered(entries)
    cells = report.accuracy_cells({n: report.best_last(entries[n]) for n in names})
    lines = ["| algorithm | best, different models (%) | last, different models (%) | best, one model (%) | "
             "last, one model (%) | what crosses the wire | MB/round up / down | CPU-s/run | seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    total = 0.0
    for n in names:
        runs = entries[n]["runs"]
        cpu = sum(r["cpu_s"] or 0.0 for r in runs)
        total += cpu
        one = shared.get(n, ("-", "-"))
        shares = get_server_class(n).model_support.shares
        lines.append(f"| {n} | {' | '.join(cells[n])} | {one[0]} | {one[1]} | {shares} | {report.mb_cell(runs)} | "
                     f"{cpu / len(runs):.0f} | {len(runs)} |")
    seeds = sorted({len(entries[n]["runs"]) for n in names})
    lines.append(f"\n{len(names)} algorithms, {sum(len(entries[n]['runs']) for n in names)} runs "
                 f"({' or '.join(map(str, seeds))} seeds each), {total / 3600:.3f} CPU-hours in all (the sweep's records: "
                 f"user + system time of each run and its worker processes).")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(REPO / "results" / "benchmark_hetero"), help="the sweep's folder")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmark.md")
    p.add_argument("--export", type=Path, default=EXPORT)
    p.add_argument("--from-export", action="store_true", help="the rows from the export alone")
    p.add_argument("--print", action="store_true", help="print the rows instead of writing the document")
    args = p.parse_args(argv)
    try:
        data = (json.loads(args.export.read_text()) if args.from_export
                else report.write_export(args.results, args.export, CONFIG))
        quick = json.loads(report.QUICK_EXPORT.read_text()) if report.QUICK_EXPORT.exists() else {}
        text = hetero_markdown(data, shared_model_cells(quick, data))
        if args.print:
            print(text)
        else:
            report.write_block(args.doc, "hetero", text)
            print(f"export: {args.export}; rows written to {args.doc}")
    except (table.TableError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
