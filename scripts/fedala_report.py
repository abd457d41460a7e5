"""Tables and learning curves for docs/fedala_reproduction.md from the driver's result files.

Called by ``python scripts/fedala_experiments.py report``: rewrites the part of the report between the
``<!-- tables:<results folder>:begin -->`` and ``... end -->`` markers and the PNGs under docs/img/.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "system"))
DOC = REPO / "docs" / "fedala_reproduction.md"
IMG = REPO / "docs" / "img"
ROWS = ["FedAvg", "FedProx", "FedALA", "FedProx+ALA", "Local"]


def load(out: Path, stems: list[str], rounds: int) -> dict | None:
    """Per-run series of the finished runs among ``stems`` (None when none finished)."""
    runs = []
    for stem in stems:
        h5, meta = out / f"{stem}.h5", out / f"{stem}.json"
        if not (h5.exists() and meta.exists()) or json.loads(meta.read_text())["evaluations"] != rounds + 1:
            continue
        from utils.results import read_h5

        series = read_h5(h5)
        runs.append({"acc": series["rs_test_acc"], "round": series["rs_round"], "time": series["rs_round_time"],
                     "meta": json.loads(meta.read_text())})
    return runs or None


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(args, plan, result_stem) -> None:
    out = REPO / args.results
    get = {}
    for group, split, goal, flags in plan:
        stems = [result_stem(split, flags, goal, r) for r in range(args.runs)]
        label = flags[flags.index("-algo") + 1] + ("+ALA" if "-ala" in flags else "")
        get[(group, split, goal, label)] = load(out, stems, args.rounds)
    main_splits = list(dict.fromkeys(s for g, s, _, _ in plan if g == "main"))
    lines = []
    if main_splits:
        lines += ["### Main table: best / last test accuracy (%)", "",
                  "| method | " + " | ".join(main_splits) + " | s/round (" + main_splits[-1] + ") |",
                  "|---" * (len(main_splits) + 2) + "|"]
        for row in ROWS:
            cells = [cell(get.get(("main", s, "repro", row))) for s in main_splits]
            lines.append(f"| {row} | " + " | ".join(cells) + f" | {sec_per_round(get.get(('main', main_splits[-1], 'repro', row)))} |")
        for s in main_splits:
            curves(s, {r: get.get(("main", s, "repro", r)) for r in ROWS}, IMG / f"fedala_{s}.png")
        lines += ["", *[f"![{s}](img/fedala_{s}.png)" for s in main_splits], ""]
        lines += ["### Time ALA adds per round (s; round time includes the evaluation, identical for both)", "",
                  "| split | FedAvg round 1 | FedALA round 1 (start phase) | FedAvg later rounds | FedALA later rounds |",
                  "|---|---|---|---|---|"]
        for s in main_splits:
            a, b = get.get(("main", s, "repro", "FedAvg")), get.get(("main", s, "repro", "FedALA"))
            if a and b:
                ta, tb = a[0]["time"], b[0]["time"]
                lines.append(f"| {s} | {ta[1]:.1f} | {tb[1]:.1f} | {ta[2:].mean():.1f} | {tb[2:].mean():.1f} |")
        lines.append("")
    hetero = [s for g, s, _, _ in plan if g == "hetero"]
    if hetero:
        splits = sorted(set(hetero) | {s for s in main_splits if s.startswith("FMNIST_dir0.1")},
                        key=lambda s: float(re.search(r"dir([0-9.]+?)(_|$)", s).group(1)))
        lines += ["### Heterogeneity (FMNIST): best / last test accuracy (%)", "",
                  "| method | " + " | ".join(splits) + " |", "|---" * (len(splits) + 1) + "|"]
        for row in ("FedAvg", "FedALA"):
            cells = [cell(get.get(("hetero", s, "repro", row)) or get.get(("main", s, "repro", row))) for s in splits]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        lines.append("")
    sens = [(s, goal) for g, s, goal, _ in plan if g == "sens"]
    if sens:
        split = sens[0][0]
        base = get.get(("main", split, "repro", "FedALA"))
        lines += [f"### Sensitivity of FedALA on {split}: best / last test accuracy (%)", "",
                  "| p (layers) | 1 | 2 | all |", "|---|---|---|---|",
                  f"| s = 80 | {cell(base)} | {cell(get.get(('sens', split, 'p2', 'FedALA')))} | "
                  f"{cell(get.get(('sens', split, 'p0', 'FedALA')))} |", "",
                  "| s (%) | 5 | 20 | 80 | 100 |", "|---|---|---|---|---|",
                  f"| p = 1 | {cell(get.get(('sens', split, 's5', 'FedALA')))} | "
                  f"{cell(get.get(('sens', split, 's20', 'FedALA')))} | {cell(base)} | "
                  f"{cell(get.get(('sens', split, 's100', 'FedALA')))} |", ""]
    base_splits = list(dict.fromkeys(s for g, s, _, _ in plan if g == "baselines"))
    if base_splits:
        from fedala_experiments import ALA_PLUGINS, BASELINES

        def find(split, label):
            return next((v for (g, s, goal, lab), v in get.items() if s == split and lab == label and goal == "repro"
                         and v), None)

        header = " | ".join(f"{s} | +ALA | s/round" for s in base_splits)
        lines += ["### All methods: best / last test accuracy (%), with ALA plugged in, and seconds per round", "",
                  f"| method | {header} |", "|---" * (1 + 3 * len(base_splits)) + "|"]
        for algo in ["FedAvg", "FedProx", *BASELINES, "Local", "FedALA"]:
            cells = []
            for s in base_splits:
                plug = "FedALA" if algo == "FedAvg" else f"{algo}+ALA"
                has_plug = algo in ("FedAvg", "FedProx", *ALA_PLUGINS)
                cells += [cell(find(s, algo)), cell(find(s, plug)) if has_plug else "n/a", sec_per_round(find(s, algo))]
            lines.append(f"| {algo} | " + " | ".join(cells) + " |")
        lines.append("")
    metas = [r["meta"] for runs in get.values() if runs for r in runs]
    if metas:
        m = metas[0]["machine"]
        wall = sum(x["wall_time_s"] for x in metas)
        lines += [f"Machine: {m['processor']}, {m['cpus']} CPUs, Python {m['python']}, {m['platform']}. "
                  f"{len(metas)} runs, {wall / 3600:.2f} h of wall time in all.", ""]
    text = DOC.read_text() if DOC.exists() else ""
    key = Path(args.results).name
    begin, end = f"<!-- tables:{key}:begin -->", f"<!-- tables:{key}:end -->"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    DOC.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
    print("\n".join(lines))
