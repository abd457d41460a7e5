"""Tables and learning curves for docs/fedala_reproduction.md from the runs of a sweep file.

    python scripts/run/sweep.py --config scripts/experiments/fedala_repro.json -j 3    # the runs (resumable)
    python scripts/experiments/fedala_report.py scripts/experiments/fedala_repro.json  # main, hetero and sens tables
    python scripts/experiments/fedala_report.py scripts/experiments/fedala_table.json --sections baselines

The runs are the sweep's own jobs (``sweep.build_jobs`` on the file: the same result names), a run counts
when ``sweep.is_complete`` says so, and its series are read by ``utils.results.read_h5``. Rewrites the part
of the report between the ``<!-- tables:<results folder>:begin -->`` and ``... end -->`` markers and the
PNGs under docs/img/. Sections (``--sections``): ``main`` (the splits on which every method of ``ROWS``
ran), ``hetero`` (FedAvg and FedALA on every FMNIST Dir(alpha) split), ``sens`` (FedALA's ``--ala_layers``
and ``-s`` variants), ``baselines`` (every method of the FedALA paper's comparison, with "+ALA").
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401
from utils import fileio  # noqa: E402

DOC = REPO / "docs" / "fedala_reproduction.md"
IMG = REPO / "docs" / "img"
ROWS = ["FedAvg", "FedProx", "FedALA", "FedProx+ALA", "Local"]
# The FedALA paper's comparison beyond FedAvg, FedProx, FedALA and Local, and the methods ALA plugs into.
BASELINES = ["FedAvg-C", "FedProx-C", "Per-FedAvg", "FedRep", "pFedMe", "Ditto", "FedAMP", "FedPHP", "FedFomo",
             "APPLE", "PartialFed"]
ALA_PLUGINS = ["Per-FedAvg", "FedRep", "pFedMe", "Ditto", "FedAMP", "FedPHP", "PartialFed"]


def load_sweep(config: Path) -> tuple[dict, Path]:
    """{(split, label, variant): [per-run series]} of the complete runs of the sweep file ``config``, and its
    results folder. ``label``: the algorithm, "+ALA" with -ala; ``variant``: the grid point's other flags
    (``--ala_layers=2``; "" for none)."""
    from scripts.run import sweep
    from utils.errors import FLError
    from utils.results import check_series, read_h5

    spec = sweep.load_config_file(config)
    out = REPO / spec.get("out", "results/sweep")
    jobs, _ = sweep.build_jobs([str(a) for a in spec.get("base", [])], spec.get("grids", [{}]), spec.get("seeds", [0]),
                               spec.get("tag", "sweep"), out, spec.get("per_algorithm"))
    runs: dict = {}
    for job in jobs:
        point = job.grid_point
        label = point["-algo"] + ("+ALA" if point.get("-ala") == "true" else "")
        variant = ",".join(f"{k}={v}" for k, v in point.items() if k not in ("-data", "-algo", "-ala"))
        entry = runs.setdefault((point["-data"], label, variant), [])
        if sweep.is_complete(job):
            try:  # a malformed result file is left out with one warning line
                series = check_series(read_h5(job.h5), job.h5)
                entry.append({"acc": series["rs_test_acc"], "round": series["rs_round"],
                              "time": series["rs_round_time"],
                              "meta": fileio.read_json(job.h5.with_suffix(".json"), "sidecar")})
            except (FLError, KeyError) as e:
                print(f"warning: {job.h5.name} left out ({fileio.why(e)})", file=sys.stderr)
    return runs, out


def fmt(values) -> str:
    v = 100 * np.asarray(values)
    return f"{v.mean():.2f}" if len(v) == 1 else f"{v.mean():.2f} ± {v.std():.2f}"


def cell(runs) -> str:
    if runs is None:
        return "—"
    best = fmt([r["acc"].max() for r in runs])
    last = fmt([r["acc"][-1] for r in runs])
    return f"{best} / {last}"


def sec_per_round(runs) -> str:
    return "—" if runs is None else f"{np.mean([r['time'].mean() for r in runs]):.1f}"


def curves(title: str, series: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, runs in series.items():
        if runs:
            ax.plot(runs[0]["round"], 100 * np.mean([r["acc"] for r in runs], axis=0), label=name)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fileio.write_figure(path, fig, dpi=90)
    plt.close(fig)


def write_report(config: Path, sections: list[str], doc: Path = DOC, img: Path = IMG) -> None:
    runs, out = load_sweep(config)
    get = {k: v or None for k, v in runs.items()}
    splits = list(dict.fromkeys(s for s, _, _ in runs))
    lines = []
    main_splits = [s for s in splits if all((s, row, "") in runs for row in ROWS)] if "main" in sections else []
    if main_splits:
        lines += ["### Main table: best / last test accuracy (%)", "",
                  "| method | " + " | ".join(main_splits) + " | s/round (" + main_splits[-1] + ") |",
                  "|---" * (len(main_splits) + 2) + "|"]
        for row in ROWS:
            cells = [cell(get.get((s, row, ""))) for s in main_splits]
            lines.append(f"| {row} | " + " | ".join(cells) + f" | {sec_per_round(get.get((main_splits[-1], row, '')))} |")
        for s in main_splits:
            curves(s, {r: get.get((s, r, "")) for r in ROWS}, img / f"fedala_{s}.png")
        lines += ["", *[f"![{s}](img/fedala_{s}.png)" for s in main_splits], ""]
        lines += ["### Time ALA adds per round (s; round time includes the evaluation, identical for both)", "",
                  "| split | FedAvg round 1 | FedALA round 1 (start phase) | FedAvg later rounds | FedALA later rounds |",
                  "|---|---|---|---|---|"]
        for s in main_splits:
            a, b = get.get((s, "FedAvg", "")), get.get((s, "FedALA", ""))
            if a and b:
                ta, tb = a[0]["time"], b[0]["time"]
                lines.append(f"| {s} | {ta[1]:.1f} | {tb[1]:.1f} | {ta[2:].mean():.1f} | {tb[2:].mean():.1f} |")
        lines.append("")
    hetero = [s for s in splits if s.startswith("FMNIST_dir") and (s, "FedAvg", "") in runs
              and (s, "FedALA", "") in runs] if "hetero" in sections else []
    if len(hetero) > 1:
        hetero.sort(key=lambda s: float(re.search(r"dir([0-9.]+?)(_|$)", s).group(1)))
        lines += ["### Heterogeneity (FMNIST): best / last test accuracy (%)", "",
                  "| method | " + " | ".join(hetero) + " |", "|---" * (len(hetero) + 1) + "|"]
        for row in ("FedAvg", "FedALA"):
            lines.append(f"| {row} | " + " | ".join(cell(get.get((s, row, ""))) for s in hetero) + " |")
        lines.append("")
    sens = [s for s, label, variant in runs if label == "FedALA" and variant] if "sens" in sections else []
    if sens:
        split = sens[0]
        base = get.get((split, "FedALA", ""))

        def var(v):
            return cell(get.get((split, "FedALA", v)))

        lines += [f"### Sensitivity of FedALA on {split}: best / last test accuracy (%)", "",
                  "| p (layers) | 1 | 2 | all |", "|---|---|---|---|",
                  f"| s = 80 | {cell(base)} | {var('--ala_layers=2')} | {var('--ala_layers=0')} |", "",
                  "| s (%) | 5 | 20 | 80 | 100 |", "|---|---|---|---|---|",
                  f"| p = 1 | {var('-s=5')} | {var('-s=20')} | {cell(base)} | {var('-s=100')} |", ""]
    base_splits = [s for s in splits if any((s, b, "") in runs for b in BASELINES)] if "baselines" in sections else []
    if base_splits:
        header = " | ".join(f"{s} | +ALA | s/round" for s in base_splits)
        lines += ["### All methods: best / last test accuracy (%), with ALA plugged in, and seconds per round", "",
                  f"| method | {header} |", "|---" * (1 + 3 * len(base_splits)) + "|"]
        for algo in ["FedAvg", "FedProx", *BASELINES, "Local", "FedALA"]:
            cells = []
            for s in base_splits:
                plug = "FedALA" if algo == "FedAvg" else f"{algo}+ALA"
                has_plug = algo in ("FedAvg", "FedProx", *ALA_PLUGINS)
                cells += [cell(get.get((s, algo, ""))), cell(get.get((s, plug, ""))) if has_plug else "n/a",
                          sec_per_round(get.get((s, algo, "")))]
            lines.append(f"| {algo} | " + " | ".join(cells) + " |")
        lines.append("")
    metas = [r["meta"] for runs in get.values() if runs for r in runs]
    if metas:
        m = metas[0]["machine"]
        wall = sum(x["wall_time_s"] for x in metas)
        lines += [f"Machine: {m['processor']}, {m['cpus']} CPUs, Python {m['python']}, {m['platform']}. "
                  f"{len(metas)} runs, {wall / 3600:.2f} h of wall time in all.", ""]
    text = fileio.read_text(doc, "document") if doc.exists() else ""
    key = out.name
    begin, end = f"<!-- tables:{key}:begin -->", f"<!-- tables:{key}:end -->"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    fileio.write_file(doc, head + begin + "\n" + "\n".join(lines) + "\n" + end + tail, "document")
    print("\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path,
                   help="the sweep file the runs came from (scripts/experiments/fedala_repro.json, ...)")
    p.add_argument("--sections", default="main,hetero,sens,baselines",
                   help="comma-separated: main, hetero, sens, baselines (each written when its runs exist)")
    args = p.parse_args(argv)
    write_report(args.config, args.sections.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
