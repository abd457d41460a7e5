"""docs/benchmark.md's model-heterogeneous rows, through compact exports of every run (as benchmark_report.py
does for the other protocols, whose export and table helpers it reuses).

    python scripts/run/sweep.py --config scripts/experiments/benchmark_hetero.json --seeds 0 -j 1      # one seed of every row
    python scripts/run/sweep.py --config scripts/experiments/benchmark_hetero_one.json --seeds 0 -j 1  # CIFAR-10, one model
    python scripts/run/sweep.py --config scripts/experiments/benchmark_hetero.json -j 1                # the other seeds
    python scripts/run/sweep.py --config scripts/experiments/benchmark_hetero_one.json -j 1
    python scripts/experiments/hetero_report.py                                                     # exports -> rows

Two exports, each holding per split and algorithm the reproducing command and per seed the accuracy curve,
bytes and seconds per round, the CPU seconds the sweep recorded and the code's commit: the heterogeneous
runs (``docs/benchmarks/hetero.json``, from ``benchmark_hetero.json``) and the same algorithms with one
shared model (``-m CNN`` on every client) on the splits that the quick protocol has no table of
(``docs/benchmarks/hetero_one.json``, from ``benchmark_hetero_one.json``). They are kept apart because a
table groups runs by (split, algorithm): in one folder or export the two kinds of run would merge.

One table per split of the heterogeneous export. Each row sits beside the same algorithm with one shared
model, taken from the quick protocol's export (``docs/benchmarks/quick.json``) where its runs there were made
on the same split (the same config hash), else from the one-model export under the same rule, else "-";
it gives the CPU seconds its runs took. The tables replace the block between ``<!-- hetero:begin -->`` and
``<!-- hetero:end -->``.

At convergence (``--converged``): the same algorithms on Protocol B's two splits (150 rounds at ``-lr 0.005``,
``benchmark_hetero_converged.json``), into ``docs/benchmarks/hetero_converged.json`` and the block
``<!-- hetero-converged:begin -->``, while the sweep runs:

    nice -n 19 python scripts/run/sweep.py --config scripts/experiments/benchmark_hetero_converged.json -j 1 --checkpoint-every 10
    python scripts/experiments/hetero_report.py --converged

Every (split, algorithm) of the sweep file gets a row. Its accuracies appear only once each of the file's
seeds has ended (finished, or diverged): "pending" until then, never a mean of some seeds. Beside each, the
same algorithm with one shared model from Protocol B's export (``docs/benchmarks/converged.json``), where
its runs there were made on the split of the heterogeneous runs (the same config hash).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from scripts.experiments import benchmark_report as report
from scripts.run import table
from utils import fileio
from utils.errors import FLError

REPO = report.REPO
EXPORT = REPO / "docs" / "benchmarks" / "hetero.json"
ONE_EXPORT = REPO / "docs" / "benchmarks" / "hetero_one.json"
CONFIG = "benchmark_hetero.json"
ONE_CONFIG = "benchmark_hetero_one.json"
QUICK_NAME, ONE_NAME = "docs/benchmarks/quick.json", "docs/benchmarks/hetero_one.json"  # the one-model sources
CONVERGED_EXPORT = REPO / "docs" / "benchmarks" / "hetero_converged.json"
CONVERGED_CONFIG = "benchmark_hetero_converged.json"
ENDED = ("finished", "diverged")  # a run in either state is over: a rerun would give the same curve


def split_hashes(entries: dict) -> set:
    """The split config hashes of every run of a split's entries."""
    return {r.get("split_hash") for e in entries.values() for r in e["runs"]}


def one_model_entries(sources: list[tuple[str, dict]], split: str, hetero: dict) -> dict[str, tuple[str, dict]]:
    """{algorithm: (source name, entry)} of the one-model runs for ``split``, whose heterogeneous entries
    are ``hetero``: for each algorithm, the first of ``sources`` ((name, export) pairs, in order of
    preference) whose runs of it on ``split`` were all made on the one split of every heterogeneous run
    (the same config hash). Nothing when the heterogeneous runs span two splits of that name."""
    hashes = split_hashes(hetero)
    chosen: dict[str, tuple[str, dict]] = {}
    if len(hashes) != 1:
        return chosen
    for name, source in sources:
        for algo, entry in source.get("splits", {}).get(split, {}).items():
            if algo not in chosen and {r.get("split_hash") for r in entry["runs"]} == hashes:
                chosen[algo] = (name, entry)
    return chosen


def shared_model_cells(quick: dict, data: dict, split: str | None = None,
                       one_model: dict | None = None) -> dict[str, tuple[str, str]]:
    """{algorithm: (best cell, last cell)} with one shared model on ``split`` (default: the one split of the
    heterogeneous export ``data``), from the quick protocol's export ``quick`` where its runs were made on
    the split of every heterogeneous run there (the same config hash), else from the one-model export
    ``one_model`` under the same rule; the other algorithms are left out (their row shows "-")."""
    if split is None:
        if len(data["splits"]) != 1:
            raise ValueError(f"the export holds {len(data['splits'])} splits: name one")
        (split,) = data["splits"]
    chosen = one_model_entries([(QUICK_NAME, quick), (ONE_NAME, one_model or {})], split, data["splits"][split])
    entries = {n: e for n, (_, e) in chosen.items()}
    cells = report.accuracy_cells({n: report.best_last(e) for n, e in entries.items()}) if entries else {}
    return {n: tuple(c.replace("**", "") for c in pair) for n, pair in cells.items()}


def cpu_hours(entries: dict) -> float:
    return sum(r["cpu_s"] or 0.0 for e in entries.values() for r in e["runs"]) / 3600


def split_markdown(split: str, entries: dict, quick: dict, one_model: dict) -> str:
    """One split's rows: per algorithm its best and last accuracy with different models, the same with one
    shared model, what crosses the wire, the CPU seconds of a run and its seed count; then the totals."""
    from flcore.registry import get_server_class

    names = report.ordered(entries)
    cells = report.accuracy_cells({n: report.best_last(entries[n]) for n in names})
    shared = shared_model_cells(quick, {"splits": {split: entries}}, split, one_model)
    sources = one_model_entries([(QUICK_NAME, quick), (ONE_NAME, one_model)], split, entries)
    lines = [f"**{split}**\n",
             "| algorithm | best, different models (%) | last, different models (%) | best, one model (%) | "
             "last, one model (%) | what crosses the wire | MB/round up / down | CPU-s/run | seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        runs = entries[n]["runs"]
        cpu = sum(r["cpu_s"] or 0.0 for r in runs)
        one = shared.get(n, ("-", "-"))
        shares = get_server_class(n).declares.model_support.shares
        lines.append(f"| {n} | {' | '.join(cells[n])} | {one[0]} | {one[1]} | {shares} | {report.mb_cell(runs)} | "
                     f"{cpu / len(runs):.0f} | {len(runs)} |")
    seeds = sorted({len(entries[n]["runs"]) for n in names})
    used = sorted({s for s, _ in sources.values()})
    made = {n: e for n, (s, e) in sources.items() if s == ONE_NAME}
    total = (f"\n{len(names)} algorithms, {sum(len(entries[n]['runs']) for n in names)} runs "
             f"({' or '.join(map(str, seeds))} seed{'' if seeds == [1] else 's'} each), {cpu_hours(entries):.3f} CPU-hours in all (the sweep's "
             f"records: user + system time of each run and its worker processes). One model: "
             f"{' and '.join(used) if used else 'no runs on this split'}")
    if made:
        total += (f"; its {sum(len(e['runs']) for e in made.values())} runs for this column took "
                  f"{cpu_hours(made):.3f} CPU-hours")
    return "\n".join(lines) + "\n" + total + "."


def hetero_markdown(data: dict, quick: dict, one_model: dict | None = None) -> str:
    """Every split's rows (``split_markdown``), in the export's order."""
    return "\n\n".join(split_markdown(split, entries, quick, one_model or {})
                       for split, entries in data["splits"].items())


def read_or_write(results: str, export: Path, config: str, from_export: bool) -> dict:
    """An export, read (``from_export``) or updated from the runs under ``results``; empty when neither
    exists (the one-model sweep not run yet)."""
    if from_export or not Path(results).is_dir():
        return fileio.read_json(export, "export") if export.exists() else {"splits": {}}
    return report.write_export(results, export, config)


# ---- at convergence (Protocol B) -------------------------------------------------------------------------
def sweep_cells(config: dict) -> tuple[list[str], list[str], list[int]]:
    """(splits, algorithms, seeds) of a sweep file whose grids name ``-data`` and ``-algo``: the rows a
    table owes, whether or not a run of them has ended."""
    splits, algos = [], []
    for grid in config["grids"]:
        splits += [d for d in grid["-data"] if d not in splits]
        algos += [a for a in grid["-algo"] if a not in algos]
    return splits, algos, [int(i) for i in config["seeds"]]


def ended_runs(entry: dict | None, seeds: list[int]) -> list[dict]:
    """The runs of ``entry`` among ``seeds`` that have ended (finished or diverged), in seed order."""
    runs = {r["run"]: r for r in (entry or {"runs": []})["runs"] if r.get("status") in ENDED and r["run"] in seeds}
    return [runs[i] for i in sorted(runs)]


def mean_std(values: np.ndarray) -> str:
    return f"{values.mean():.2f} ± {values.std():.2f}"


def converged_row(name: str, entry: dict | None, one: dict | None, seeds: list[int]) -> tuple[str, list[dict]]:
    """One row: best and last accuracy with different models (mean ± population std over ``seeds``, only
    once every one of them has ended, else "pending"), the same with one model (``one``, "-" when absent),
    the difference of the best means, how much the best still rose over the last 20 % of the rounds, CPU
    seconds per ended run and how many seeds have ended. Returns (row, ended runs)."""
    runs = ended_runs(entry, seeds)
    complete = len(runs) == len(seeds)
    hetero = report.best_last({"runs": runs}) if complete else None
    shared = report.best_last(one) if one else None
    cells = [mean_std(hetero[0]), mean_std(hetero[1])] if complete else ["pending", "pending"]
    cells += [mean_std(shared[0]), mean_std(shared[1])] if one else ["-", "-"]
    cells.append(f"{hetero[0].mean() - shared[0].mean():+.2f}" if complete and one else "-")
    rise = report.flatness({"runs": runs}) if complete else float("nan")
    cells.append("-" if np.isnan(rise) else f"{rise:.2f}")
    cpu = [r["cpu_s"] for r in runs if r.get("cpu_s") is not None]
    cells.append(f"{np.mean(cpu):.0f}" if cpu else "-")
    cells.append(f"{len(runs)} of {len(seeds)}")
    return f"| {name} | " + " | ".join(cells) + " |", runs


def converged_split_markdown(split: str, entries: dict, one_model: dict, algorithms: list[str],
                             seeds: list[int]) -> tuple[str, list[dict], int]:
    """One split's table over ``algorithms`` (registry order); the one-model column from ``one_model``'s
    entries of the split, each only where its runs' split hash is that of every heterogeneous run that has
    ended on the split (any when none has). Returns (table, ended runs, complete cells)."""
    hashes = {r.get("split_hash") for e in entries.values() for r in ended_runs(e, seeds)}
    lines = [f"**{split}**\n",
             "| algorithm | best, different models (%) | last, different models (%) | best, one model (%) | "
             "last, one model (%) | best: different - one (pt) | still rising (pt) | CPU-s/run | seeds ended |",
             "|---|---|---|---|---|---|---|---|---|"]
    ended, complete = [], 0
    for n in report.ordered({a: None for a in algorithms}):
        one = one_model.get(n)
        if one is not None and hashes and {r.get("split_hash") for r in one["runs"]} != hashes:
            one = None  # made on another split of this name: not comparable
        row, runs = converged_row(n, entries.get(n), one, seeds)
        lines.append(row)
        ended += runs
        complete += len(runs) == len(seeds)
    return "\n".join(lines), ended, complete


def converged_markdown(data: dict, one_model: dict, config: dict) -> str:
    """Both splits' tables (``converged_split_markdown``) for the cells of the sweep file ``config``, the
    heterogeneous runs from the export ``data`` and the one-model runs from Protocol B's export
    ``one_model``; then what has ended and the CPU time it took."""
    splits, algorithms, seeds = sweep_cells(config)
    blocks, ended, complete = [], [], 0
    for split in splits:
        text, runs, done = converged_split_markdown(split, data.get("splits", {}).get(split, {}),
                                                    one_model.get("splits", {}).get(split, {}), algorithms, seeds)
        blocks.append(text)
        ended += runs
        complete += done
    cpu = sum(r["cpu_s"] or 0.0 for r in ended)
    unrecorded = sum(r.get("cpu_s") is None for r in ended)
    total = (f"{complete} of {len(splits) * len(algorithms)} cells complete ({len(seeds)} seeds ended each), "
             f"{len(ended)} of {len(splits) * len(algorithms) * len(seeds)} runs ended, {cpu / 3600:.3f} "
             f"CPU-hours in all (the sweep's records: user + system time of each ended run)")
    if unrecorded:
        total += f"; {unrecorded} ended run{'s' if unrecorded > 1 else ''} without a record"
    return "\n\n".join(blocks) + "\n\n" + total + "."


def converged_data(results: str, export: Path, from_export: bool) -> dict:
    """The export at convergence, updated from the runs under ``results`` that have ended; the export as
    it stands (empty when absent) with ``from_export`` or while no run under ``results`` has ended."""
    if not from_export:
        try:
            return report.write_export(results, export, CONVERGED_CONFIG)
        except table.TableError as e:
            print(f"note: {e}: the rows come from the export as it stands", file=sys.stderr)
    return fileio.read_json(export, "--export") if export.exists() else {"splits": {}}


def main_converged(args) -> int:
    config = fileio.read_json(REPO / "scripts" / "experiments" / CONVERGED_CONFIG, "sweep file")
    data = converged_data(args.results, args.export, args.from_export)
    one_model = fileio.read_json(report.EXPORT, "export")
    text = converged_markdown(data, one_model, config)
    if args.print:
        print(text)
    else:
        report.write_block(args.doc, "hetero-converged", text)
        print(f"export: {args.export}; rows written to {args.doc}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--converged", action="store_true",
                   help="the rows at convergence (Protocol B: benchmark_hetero_converged.json) instead")
    p.add_argument("--results", default=None, help="the sweep's folder (default: results/benchmark_hetero, "
                                                   "with --converged results/benchmark_hetero_converged)")
    p.add_argument("--one-results", default=str(REPO / "results" / "benchmark_hetero_one"),
                   help="the one-model sweep's folder")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmark.md")
    p.add_argument("--export", type=Path, default=None,
                   help="default: docs/benchmarks/hetero.json, with --converged hetero_converged.json")
    p.add_argument("--one-export", type=Path, default=ONE_EXPORT)
    p.add_argument("--from-export", action="store_true", help="the rows from the exports alone")
    p.add_argument("--print", action="store_true", help="print the rows instead of writing the document")
    args = p.parse_args(argv)
    folder, export = ("benchmark_hetero_converged", CONVERGED_EXPORT) if args.converged else ("benchmark_hetero", EXPORT)
    args.results = args.results or str(REPO / "results" / folder)
    args.export = args.export or export
    try:
        if args.converged:
            return main_converged(args)
        data = (fileio.read_json(args.export, "--export") if args.from_export
                else report.write_export(args.results, args.export, CONFIG))
        one = read_or_write(args.one_results, args.one_export, ONE_CONFIG, args.from_export)
        quick = fileio.read_json(report.QUICK_EXPORT, "export") if report.QUICK_EXPORT.exists() else {}
        text = hetero_markdown(data, quick, one)
        if args.print:
            print(text)
        else:
            report.write_block(args.doc, "hetero", text)
            print(f"exports: {args.export}, {args.one_export}; rows written to {args.doc}")
    except (table.TableError, FLError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
