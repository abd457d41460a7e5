"""docs/benchmark.md's rows from the benchmark sweeps, through a compact export of every run.

Both protocols first fold the runs their sweeps have finished into a committed export (per split and
algorithm the reproducing command, and per seed the accuracy curve, bytes and seconds per round, the CPU
seconds the sweep recorded and the code's commit), then draw every table cell and figure from the export
alone. A run found in the results replaces the same (split, algorithm, seed) in the export and every other
entry is kept, so a table grows over several sweeps, sessions or machines, and a reader can redraw any
curve without the h5 files. ``--export-only`` / ``--from-export`` split the two halves.

The quick protocol (the default; ``docs/benchmarks/quick.json``): accuracy over the seeds of one sweep,
seconds per round from a second, timing-only sweep of seed 0 run alone on a quiet machine.

    python scripts/run/sweep.py --config scripts/experiments/benchmark_zoo.json                                   # 3 seeds
    python scripts/run/sweep.py --config scripts/experiments/benchmark_zoo.json --seeds 0 --out results/benchmark_timing
    python scripts/experiments/benchmark_report.py                                                            # rows -> doc

Accuracies are deterministic (the same seed gives the same curve on any executor), so the timing sweep's
seed 0 must reproduce the accuracy sweep's seed 0 exactly: every row is checked, and a mismatch (or a row
without a timing run) is an error. Seconds per round are wall time, which other processes on the machine
inflate; the accuracy sweep may share the machine, the timing sweep should not. The rows replace the block
between ``<!-- rows:begin -->`` and ``<!-- rows:end -->`` of the document.

Protocol B, converged (``--protocol converged``; ``docs/benchmarks/converged.json``):

    python scripts/run/sweep.py --config scripts/experiments/benchmark_converged.json -j 2  # both splits, 3 seeds
    python scripts/experiments/benchmark_report.py --protocol converged                     # export, rows, figures

(``--protocol converged-s2000``: its first size, 2,000 images for 100 rounds, whose curves had not
flattened: ``scripts/experiments/benchmark_converged_s2000.json``, ``docs/benchmarks/converged_s2000.json``.)

gives the two tables (best and last accuracy, PFLlib's published leaderboard value beside every algorithm
it has, ``docs/benchmarks/pfllib_leaderboard.json``), the flatness check, the Spearman rank correlation
with PFLlib's ordering, and the figures (curves of the traditional and the personalised groups with ±1 std
bands, this library's ranks against PFLlib's). Each table replaces the block between
``<!-- converged-<split>:begin -->`` and its ``end`` marker.

Ablations (``--protocol ablations``; ``docs/benchmarks/ablations.json``): the runs that test an explanation
of a Protocol B row by measurement, one row per variant (the flags in which runs of one split and algorithm
differ), into the block ``<!-- ablations:begin -->``:

    python scripts/run/sweep.py --config scripts/experiments/benchmark_ablations.json
    python scripts/experiments/benchmark_report.py --protocol ablations
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from scripts.run import table  # noqa: E402
from utils import fileio  # noqa: E402
from utils.errors import FLError  # noqa: E402

EXPORT = REPO / "docs" / "benchmarks" / "converged.json"
EXPORT_S2000 = REPO / "docs" / "benchmarks" / "converged_s2000.json"
QUICK_EXPORT = REPO / "docs" / "benchmarks" / "quick.json"
ABLATIONS_EXPORT = REPO / "docs" / "benchmarks" / "ablations.json"
LEADERBOARD = REPO / "docs" / "benchmarks" / "pfllib_leaderboard.json"
# Protocol B's splits (and those of its first, larger size) -> PFLlib's leaderboard column
SPLITS = {"FMNIST_pat_s1200": "pat", "FMNIST_dir0.1_s1200": "dir",
          "FMNIST_pat_s2000": "pat", "FMNIST_dir0.1_s2000": "dir"}


def traditional(name: str) -> bool:
    """Whether an entry belongs to the traditional-FL group of the figures: its algorithm is evaluated on
    the global model (its server declares ``personalized=False``); every other algorithm is personalised."""
    from flcore.registry import ALGORITHMS, get_server_class

    algo = name.split("+")[0]
    return algo in ALGORITHMS and not get_server_class(algo).declares.personalized

FLAT_PT, FLAT_TAIL, FLAT_TOP = 0.5, 0.2, 5  # the flatness criterion: see flatness()


def accuracy_cells(stats: dict) -> dict:
    """{algorithm: (best cell, last cell)} from {algorithm: (best per seed, last per seed)} in %: mean ± the
    population std over seeds (the mean alone for one seed), in bold where the mean, as shown, is the
    column's best (no bold when every row ties)."""
    cells = {n: [] for n in stats}
    for col in (0, 1):
        shown = {n: round(float(v[col].mean()), 2) for n, v in stats.items()}
        top = max(shown.values())
        tie = len(stats) < 2 or all(m == top for m in shown.values())
        for n, v in stats.items():
            text = f"{v[col].mean():.2f} ± {v[col].std():.2f}" if len(v[col]) > 1 else f"{v[col].mean():.2f}"
            cells[n].append(f"**{text}**" if shown[n] == top and not tie else text)
    return cells


def mb_cell(runs: list[dict]) -> str:
    """Megabytes per round up / down, summed over the clients, averaged over rounds and seeds."""
    up = [r["mb_up"] for r in runs if r["mb_up"] is not None]
    down = [r["mb_down"] for r in runs if r["mb_down"] is not None]
    return f"{np.mean(up):.2f} / {np.mean(down):.2f}" if up and down else "-"


def seconds_cell(runs: list[dict]) -> str:
    """Seconds per round, averaged over the runs that timed a round; "-" when none did."""
    timed = [r["s_per_round"] for r in runs if r["s_per_round"] is not None]
    return f"{np.mean(timed):.2f}" if timed else "-"


def ordered(entries: dict) -> list[str]:
    """Algorithms in registry order (``X+ALA`` beside X), unknown names last."""
    order = table.registry_order()
    return sorted(entries, key=lambda n: (order.index(n.split("+")[0]) if n.split("+")[0] in order else len(order),
                                          n))


def split_problems(split: str, entries: dict) -> list[str]:
    """A table compares runs on one split: runs made on another split of the same name (another generator
    flag, another source file) are named."""
    hashes: dict = {}
    for name, entry in entries.items():
        for r in entry["runs"]:
            hashes.setdefault(r.get("split_hash"), []).append(f"{name} seed {r['run']}")
    if len(hashes) < 2:
        return []
    usual = max(hashes, key=lambda h: len(hashes[h]))
    return [f"{split}: {', '.join(runs)} ran on another split of that name (config hash {h}, not {usual})"
            for h, runs in hashes.items() if h != usual]


def quick_markdown(data: dict) -> tuple[str, list[str]]:
    """The quick protocol's table from its export, and the problems found: a row without a timing run, or
    whose timing run does not reproduce its seed 0 (the code changed between the two sweeps)."""
    (split, entries), = data["splits"].items()
    names = ordered(entries)
    cells = accuracy_cells({n: best_last(entries[n]) for n in names})
    problems = split_problems(split, entries)
    lines = ["| algorithm | best accuracy (%) | last accuracy (%) | MB/round up / down | s/round | seeds |",
             "|---|---|---|---|---|---|"]
    for n in names:
        runs, timing = entries[n]["runs"], entries[n].get("timing")
        seed0 = next((r for r in runs if r["run"] == 0), None)
        if timing is None:
            problems.append(f"{n}: no timing run")
            seconds = "-"
        elif seed0 is None or seed0["test_acc"] != timing["test_acc"]:
            problems.append(f"{n}: the timing run's seed 0 does not reproduce the accuracy run's curve")
            seconds = "-"
        else:
            seconds = seconds_cell([timing])
        lines.append(f"| {n} | {' | '.join(cells[n])} | {mb_cell(runs)} | {seconds} | {len(runs)} |")
    return "\n".join(lines), problems


# ---- the export: every run of a sweep, compact ---------------------------------------------------------
# Not part of a variant's label: what names its row already, what the split fixes, and where it ran.
NOT_IN_LABEL = table.IGNORED | {"dataset", "algorithm", "num_clients", "num_classes", "executor", "device", "overwrite",
                                 "print_config"}


@functools.lru_cache(maxsize=None)
def algorithm_defaults(base: tuple[str, ...], algo: str) -> dict:
    """The configuration ``-algo algo`` gets under the sweep's ``base`` flags (parsed once per algorithm)."""
    import cli

    return cli.parse_config([*base, "-algo", algo]).to_dict()


def variant_label(config: dict, base: list[str]) -> str:
    """The algorithm's name followed by every setting in which ``config`` (a run's configuration) differs from
    the algorithm's defaults under the sweep's ``base`` flags (``APPLE core_lr_scale=20.0
    global_rounds=150 sgd_momentum=0.0``). It depends on the run alone, so a variant keeps its row when runs
    made in another session or on another machine are merged into an export."""
    algo = config["algorithm"]
    default = algorithm_defaults(tuple(base), algo)
    keys = sorted(k for k in config if k not in NOT_IN_LABEL
                  and json.dumps(config[k], default=str) != json.dumps(default.get(k), default=str))
    return " ".join([algo, *(f"{k}={config[k]}" for k in keys)])


def variants(runs: list, base: list[str]) -> dict:
    """{result path: ``variant_label``} of every run."""
    return {r.path: variant_label(r.config, base) for r in runs}


def relabel(data: dict, base: list[str]) -> dict:
    """An export's variants keyed by ``variant_label``, read from each entry's reproducing command (an
    export written with other labels merges with new runs without losing a row)."""
    import shlex

    import cli

    out = {"splits": {}}
    for split, entries in data.get("splits", {}).items():
        for name, entry in entries.items():
            args = shlex.split(entry["command"])[2:]  # after "python system/main.py"
            label = variant_label(cli.parse_config(args).to_dict(), base)
            into = out["splits"].setdefault(split, {})
            if label in into and into[label]["command"] != entry["command"]:
                raise table.TableError(f"export entries '{into[label]['command']}' and '{entry['command']}' "
                                       f"are one variant ({label})")
            # one run exported under two labels is kept once, a seed's later copy winning
            into[label] = merge_entry(into[label], entry) if label in into else entry
    return {**data, "splits": out["splits"]}


def export_runs(results: str, by_variant: bool = False, base: list[str] = ()) -> dict:
    """Every complete run under ``results``, per split and algorithm (``by_variant``: per split and
    ``variants`` label): the reproducing command and per seed the accuracy curve, bytes per round, seconds
    per round, the CPU seconds the sweep recorded and the code's commit
    (``{"splits": {split: {algorithm: {"command", "runs"}}}}``)."""
    from scripts.run import sweep

    runs = table.load_runs([results])
    if by_variant:
        labels = variants(runs, list(base))
        for r in runs:
            r.meta["variant"] = labels[r.path]
    rows = table.aggregate(runs, ["dataset", "variant" if by_variant else "algorithm"])
    splits: dict = {}
    for row in rows:
        split, name = row.group
        runs = sorted(row.runs, key=lambda r: r.meta.get("run", 0))
        entry = {"command": table.reproduce_command(runs[0].config, [r.meta.get("run", 0) for r in runs]),
                 "runs": []}
        for r in runs:
            cpu = sweep.cpu_seconds(sweep.Job([], r.path.stem, r.path.parent, 0))
            entry["runs"].append({
                "run": r.meta.get("run", 0), "status": r.meta.get("status"),
                "commit": r.meta.get("git_commit"), "split_hash": (r.meta.get("split") or {}).get("config_hash"),
                "rounds": [int(v) for v in r.series["rs_round"]],
                "test_acc": [round(float(v), 6) for v in r.series["rs_test_acc"]],
                "mb_up": round(float(np.mean(r.series["rs_bytes_up"])) / 1e6, 4) if len(r.series.get("rs_bytes_up", ())) else None,
                "mb_down": round(float(np.mean(r.series["rs_bytes_down"])) / 1e6, 4) if len(r.series.get("rs_bytes_down", ())) else None,
                "s_per_round": finite_or_none(table.run_metrics(r, None)["time"]),
                "executor": r.config.get("executor"), "cpu_s": cpu})
        splits.setdefault(split, {})[name] = entry
    return {"splits": splits}


def finite_or_none(seconds: float) -> float | None:
    """A run's mean seconds per round, or None (JSON null) for a run that timed no round (one that diverged
    at its first): the export stays strict JSON, which has no NaN."""
    return round(seconds, 4) if math.isfinite(seconds) else None


def merge_exports(old: dict, new: dict) -> dict:
    """``old`` with ``new``'s runs laid over it: a run (split, algorithm, seed index) present in both is
    ``new``'s, so a table grows over several sweeps, sessions or machines and a rerun replaces its cell;
    every other key (``timing``) is ``new``'s where it has one."""
    merged = json.loads(json.dumps(old))
    for split, entries in new.get("splits", {}).items():
        into = merged.setdefault("splits", {}).setdefault(split, {})
        for name, entry in entries.items():
            into[name] = merge_entry(into.get(name, {"runs": []}), entry)
    return merged


def merge_entry(old: dict, new: dict) -> dict:
    """One row's entry: ``old``'s runs with ``new``'s laid over them by seed index, ``new``'s other keys."""
    runs = {r["run"]: r for r in old["runs"]} | {r["run"]: r for r in new["runs"]}
    return {**old, **{k: v for k, v in new.items() if k != "runs"}, "runs": [runs[k] for k in sorted(runs)]}


def write_export(results: str | None, out: Path, config: str, timing: str | None = None,
                 by_variant: bool = False) -> dict:
    """The export at ``out``: what it held, with the runs found under ``results`` (and, for the quick
    protocol, seed 0 of the timing sweep under ``timing``) laid over it; the protocol's description comes
    from its sweep config. Written back and returned."""
    sweep_config = fileio.read_json(REPO / "scripts" / "experiments" / config, "sweep file")
    base = sweep_config.get("base", [])
    data = fileio.read_json(out, "export") if out.exists() else {"splits": {}}
    if by_variant:
        data = relabel(data, base)
    new = export_runs(results, by_variant, base) if results and Path(results).is_dir() else {"splits": {}}
    if timing and Path(timing).is_dir():
        for split, entries in export_runs(timing)["splits"].items():
            for name, entry in entries.items():
                seed0 = next((r for r in entry["runs"] if r["run"] == 0), None)
                if seed0 is not None:
                    target = new["splits"].setdefault(split, {}).setdefault(name, {"runs": []})
                    target["timing"] = {k: seed0[k] for k in ("commit", "test_acc", "s_per_round")}
    if not new["splits"] and not data["splits"]:
        raise table.TableError(f"no complete run under {results} and no export at {out}")
    data = merge_exports(data, new)
    data["protocol"] = sweep_config["description"]
    fileio.write_file(out, json.dumps(data, indent=1, allow_nan=False) + "\n", "--export")
    return data


# ---- Protocol B, converged -----------------------------------------------------------------------------
def best_last(entry: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per seed: best and last test accuracy (%)."""
    accs = [np.asarray(r["test_acc"]) * 100 for r in entry["runs"]]
    return np.array([a.max() for a in accs]), np.array([a[-1] for a in accs])


def flatness(entry: dict) -> float:
    """How much the best accuracy still rose over the last ``FLAT_TAIL`` of the rounds (points, mean over
    seeds): the best over all evaluations minus the best up to round (1 - FLAT_TAIL) * R. The curves have
    flattened when the top ``FLAT_TOP`` rows of a table each moved less than ``FLAT_PT``. A run that diverged
    has no last rounds to judge and is left out (nan when every run diverged)."""
    moved = []
    for r in entry["runs"]:
        if r.get("status") == "diverged":
            continue
        rounds, acc = np.asarray(r["rounds"]), np.asarray(r["test_acc"]) * 100
        cut = rounds <= (1 - FLAT_TAIL) * rounds[-1]
        moved.append(acc.max() - acc[cut].max())
    return float(np.mean(moved)) if moved else float("nan")


def leaderboard_names(board: dict) -> dict:
    """PFLlib's row names -> this library's."""
    return {k: board.get("names", {}).get(k, k) for k in board["rows"]}


def spearman(ours: dict, theirs: dict) -> tuple[float, int]:
    """Spearman's rank correlation of two {algorithm: value} orderings over the algorithms both have."""
    from scipy.stats import spearmanr

    common = sorted(set(ours) & set(theirs))
    if len(common) < 3:
        return float("nan"), len(common)
    return float(spearmanr([ours[a] for a in common], [theirs[a] for a in common]).statistic), len(common)


def ranks(values: dict) -> dict:
    """1 = highest value; ties share the mean rank."""
    from utils.metrics import average_ranks

    names = list(values)
    r = average_ranks(-np.array([values[n] for n in names], dtype=float))
    return dict(zip(names, r))


def converged_markdown(data: dict, board: dict, split: str) -> tuple[str, dict]:
    """One split's table and its summary (Spearman, flatness, CPU-hours, largest rank disagreements)."""
    column = SPLITS[split]
    published = {leaderboard_names(board)[k]: v[column] for k, v in board["rows"].items()}
    entries = data["splits"][split]
    names = ordered(entries)
    stats = {n: best_last(entries[n]) for n in names}
    acc = accuracy_cells(stats)
    lines = ["| algorithm | best acc (%) | last acc (%) | PFLlib, full scale (%) | still rising (pt) | "
             "MB/round up / down | s/round | seeds |", "|---|---|---|---|---|---|---|---|"]
    for n in names:
        runs = entries[n]["runs"]
        cells = list(acc[n])
        pub = published.get(n)
        cells.append(f"{pub[0]:.2f} ± {pub[1]:.2f}" if pub else "-")
        rise = flatness(entries[n])
        cells.append("-" if np.isnan(rise) else f"{rise:.2f}")
        cells.append(mb_cell(runs))
        cells.append(seconds_cell(runs))
        cells.append(str(len(runs)))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    ours = {n: float(stats[n][0].mean()) for n in names}
    theirs = {n: v[0] for n, v in published.items()}
    rho, k = spearman(ours, theirs)
    common = sorted(set(ours) & set(theirs))
    r_ours, r_theirs = ranks({n: ours[n] for n in common}), ranks({n: theirs[n] for n in common})
    top = sorted(names, key=lambda n: -ours[n])[:FLAT_TOP]
    cpu = [r["cpu_s"] for n in names for r in entries[n]["runs"]]
    summary = {"spearman": rho, "common": k, "flat_top": {n: flatness(entries[n]) for n in top},
               "disagreements": sorted(((n, r_ours[n], r_theirs[n]) for n in common),
                                       key=lambda t: -abs(t[1] - t[2]))[:5],
               "cpu_hours": sum(c for c in cpu if c is not None) / 3600, "cpu_missing": sum(c is None for c in cpu),
               "ranks": (r_ours, r_theirs), "runs": len(cpu),
               "executors": Counter(r.get("executor") or "not recorded" for n in names for r in entries[n]["runs"])}
    return "\n".join(lines), summary


def summary_markdown(split: str, s: dict) -> str:
    flat = ", ".join(f"{n} {v:.2f}" for n, v in s["flat_top"].items())
    ok = all(v < FLAT_PT for v in s["flat_top"].values())
    worst = "; ".join(f"{n} {a:g} here vs {b:g} in PFLlib" for n, a, b in s["disagreements"])
    cpu = f"{s['cpu_hours']:.2f} CPU-hours over {s['runs']} runs" + (
        f" ({s['cpu_missing']} runs without a CPU record)" if s["cpu_missing"] else "")
    executors = ", ".join(f"{k} {v}" for k, v in sorted(s.get("executors", {}).items()))
    return (f"- Flatness (best accuracy gained over the last {FLAT_TAIL:.0%} of rounds, top {FLAT_TOP}): {flat}: "
            f"{'holds' if ok else 'does NOT hold'} (< {FLAT_PT} pt each).\n"
            f"- Spearman rank correlation with PFLlib's column over the {s['common']} algorithms both have: "
            f"{s['spearman']:.2f}. Largest rank differences (1 = best): {worst}.\n"
            f"- Cost: {cpu}. Runs per executor (s/round is wall time, which the executor and the machine's "
            f"load change; the CPU seconds are each run's own): {executors}.")


def plot_converged(data: dict, summaries: dict, out: Path, ranks_name: str = "converged_ranks") -> list[Path]:
    """Curves of each split's traditional and personalised groups (mean ± std over seeds) and one figure
    (``ranks_name``) of this library's ranks against PFLlib's (from each split's ``converged_markdown``
    summary)."""
    from scripts.run import plot

    plt = plot.plt
    written = []
    with plt.rc_context(plot.STYLE):
        for split, entries in data["splits"].items():
            for group, members in (("traditional", [n for n in entries if traditional(n)]),
                                   ("pfl", [n for n in entries if not traditional(n)])):
                if not members:
                    continue
                fig, ax = plt.subplots(figsize=(7.5, 5))
                for n in members:
                    runs = entries[n]["runs"]
                    k = min(len(r["test_acc"]) for r in runs)
                    ys = np.array([r["test_acc"][:k] for r in runs]) * 100
                    (line,) = ax.plot(runs[0]["rounds"][:k], ys.mean(0), lw=1.2, label=f"{n} (n={len(runs)})")
                    if len(runs) > 1:
                        ax.fill_between(runs[0]["rounds"][:k], ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0),
                                        color=line.get_color(), alpha=0.15, lw=0)
                ax.set_xlabel("round")
                ax.set_ylabel("test accuracy (%)")
                ax.set_title(f"{split}: {'traditional FL' if group == 'traditional' else 'personalised FL'}")
                ax.legend(fontsize=6, ncol=2 if len(members) > 12 else 1)
                written += plot.save(fig, out, f"converged_{split}_{group}")
        fig, axes = plt.subplots(1, len(summaries), figsize=(5.5 * len(summaries), 5), squeeze=False)
        for ax, (split, s) in zip(axes[0], summaries.items()):
            r_ours, r_theirs = s["ranks"]
            for n in r_ours:
                ax.scatter(r_theirs[n], r_ours[n], s=14)
                ax.annotate(n, (r_theirs[n], r_ours[n]), fontsize=7, xytext=(3, 2), textcoords="offset points")
            lim = len(r_ours) + 1
            ax.plot([0, lim], [0, lim], color="grey", lw=0.8, ls="--")
            ax.set_ylim(lim, 0)  # rank 1 at the top right
            ax.set_xlim(lim, 0)
            ax.set_xlabel("rank in PFLlib's leaderboard (1 = best)")
            ax.set_ylabel("rank here, Protocol B")
            ax.set_title(f"{split}: Spearman {s['spearman']:.2f} (n={s['common']})")
        written += plot.save(fig, out, ranks_name)
    return written


def write_block(doc: Path, name: str, text: str) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = fileio.read_text(doc, "--doc")
    if begin not in body or end not in body:
        raise table.TableError(f"{doc} lacks the {begin} / {end} markers")
    head, rest = body.split(begin, 1)
    fileio.write_file(doc, head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1], "--doc")


def report_converged(args, data: dict) -> int:
    board = fileio.read_json(LEADERBOARD, "leaderboard")
    summaries, problems = {}, []
    for split in data["splits"]:
        if split not in SPLITS:
            continue
        problems += split_problems(split, data["splits"][split])
        text, s = summaries[split] = converged_markdown(data, board, split)
        block = text + "\n\n" + summary_markdown(split, s)
        if args.print:
            print(f"## {split}\n{block}\n")
        else:
            write_block(args.doc, f"converged-{split}", block)
            print(f"wrote {split}'s rows to {args.doc}")
    if not args.print:  # --print changes no file
        ranks_figure = args.protocol.replace("-", "_") + "_ranks"
        for path in plot_converged(data, {k: s for k, (_, s) in summaries.items()}, args.figures, ranks_figure):
            print(path)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def ablations_markdown(data: dict) -> str:
    """One row per (split, variant): best and last accuracy (mean ± std over seeds), how much the best still
    rose over the last rounds (``flatness``), the runs' status (a diverged run counted), CPU seconds per run
    and the reproducing command."""
    lines = ["| split | variant | best acc (%) | last acc (%) | still rising (pt) | runs | CPU-s/run | command |",
             "|---|---|---|---|---|---|---|---|"]
    for split, entries in data["splits"].items():
        cells = accuracy_cells({n: best_last(e) for n, e in entries.items()})
        for n in ordered(entries):
            runs = entries[n]["runs"]
            status = ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["status"] for r in runs).items()))
            cpu = [r["cpu_s"] for r in runs if r["cpu_s"] is not None]
            cpu_cell = f"{np.mean(cpu):.0f}" if cpu else "-"
            best, last = (c.replace("**", "") for c in cells[n])
            rise = flatness(entries[n])
            rise_cell = "-" if np.isnan(rise) else f"{rise:.2f}"
            lines.append(f"| {split} | {n} | {best} | {last} | {rise_cell} | {status} | {cpu_cell} | "
                         f"`{entries[n]['command']}` |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(REPO / "results" / "benchmark"), help="the accuracy sweep's folder")
    p.add_argument("--timing", default=str(REPO / "results" / "benchmark_timing"), help="the timing sweep's folder")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmark.md")
    p.add_argument("--print", action="store_true",
                   help="print the rows instead of writing the document (and, converged, the figures)")
    p.add_argument("--protocol", default="quick", choices=["quick", "converged", "converged-s2000", "ablations"],
                   help="quick: the 5-round table; converged: Protocol B; converged-s2000: its first, larger size "
                        "(--results defaults to the protocol's sweep folder)")
    p.add_argument("--export", type=Path, default=None,
                   help="the compact export of every run (default: the protocol's, under docs/benchmarks/)")
    p.add_argument("--export-only", action="store_true", help="write the export, nothing else")
    p.add_argument("--from-export", action="store_true", help="tables (and figures) from the export alone")
    p.add_argument("--figures", type=Path, default=REPO / "docs" / "img", help="converged: where figures go")
    args = p.parse_args(argv)
    # per protocol: its export, its sweep config, its results folder, and how its runs are grouped
    export, config, folder, extra = {
        "quick": (QUICK_EXPORT, "benchmark_zoo.json", "benchmark", {"timing": args.timing}),
        "converged": (EXPORT, "benchmark_converged.json", "benchmark_converged_s1200", {}),
        "converged-s2000": (EXPORT_S2000, "benchmark_converged_s2000.json", "benchmark_converged", {}),
        "ablations": (ABLATIONS_EXPORT, "benchmark_ablations.json", "benchmark_ablations", {"by_variant": True}),
    }[args.protocol]
    args.export = export if args.export is None else args.export
    if args.results == str(REPO / "results" / "benchmark"):
        args.results = str(REPO / "results" / folder)
    try:
        data = (fileio.read_json(args.export, "--export") if args.from_export
                else write_export(args.results, args.export, config, **extra))
    except (table.TableError, FLError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"export: {args.export}")
    if args.export_only:
        return 0
    if args.protocol.startswith("converged"):
        return report_converged(args, data)
    if args.protocol == "ablations":
        text = ablations_markdown(data)
        if args.print:
            print(text)
        else:
            write_block(args.doc, "ablations", text)
        return 0
    text, problems = quick_markdown(data)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if args.print:
        print(text)
    else:
        write_block(args.doc, "rows", text)
        print(f"wrote {len(data['splits'][next(iter(data['splits']))])} rows to {args.doc}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
