"""Figures from result files and splits: learning curves, per-client accuracy, a split's label distribution.

    python scripts/run/plot.py curves results/sweep --out figures                # accuracy and loss vs round
    python scripts/run/plot.py curves "results/*_bench-*.h5" --x time --metrics test_acc --group algorithm,dataset
    python scripts/run/plot.py clients results/sweep --out figures               # final-round box plot
    python scripts/run/plot.py spread results/sweep                              # clients' spread vs round
    python scripts/run/plot.py split FMNIST_dir0.1_s2000 --out figures           # clients x classes heat map

``curves``: one figure per metric (``--metrics``, h5 series without the ``rs_`` prefix; default
``test_acc,train_loss``), one line per group of runs (``--group``, as ``scripts/run/table.py``): the mean over
seeds with a ±1 std band, against the evaluated round or (``--x time``) the mean cumulative wall time at
each evaluation (the rounds' wall times from the sidecar; an evaluation at round r comes after r rounds).
A metric no run recorded (e.g. ``train_loss`` with ``--train_loss_eval off``) is skipped with a note.
``clients``: the per-client test accuracy at the final evaluation (``rs_client_test_acc``), one box per
group, every seed's clients pooled. ``spread``: the distribution of the per-client test accuracy at every
evaluation, one line and two bands per group (median; 10th-90th percentile; worst to best, the worst
dotted), every seed's clients pooled. ``split``: the label count of every client (train and test together,
``--part`` for one of them) read from the split's files. Each figure is written as PNG and PDF
(``<out>/<name>.png``, ``.pdf``; ``--out`` defaults to ``results/figures``); the paths are printed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from scripts.run.table import TableError, aggregate, load_runs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LABELS = {"test_acc": "test accuracy (%)", "train_loss": "train loss", "test_auc": "test AUC (%)",
          "test_acc_mean": "mean client test accuracy (%)", "test_acc_std": "std of client test accuracy (%)"}
PERCENT = {"test_acc", "test_auc", "test_acc_mean", "test_acc_std"}
STYLE = {"figure.figsize": (6.4, 4.2), "figure.dpi": 150, "font.size": 11, "axes.grid": True, "grid.alpha": 0.3,
         "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False, "savefig.bbox": "tight"}


def save(fig, out: Path, name: str) -> list[Path]:
    """The figure as ``<name>.png`` and ``.pdf`` in ``out``, each written through ``fileio.Folder`` (a
    temporary file renamed into place; a symlink there is replaced, not followed)."""
    from utils import fileio

    try:
        folder = fileio.Folder(out, what="--out")
        for ext in ("png", "pdf"):  # no creation date in the PDF: the same curves give the same file, so no diff in git
            folder.replace([(f"{name}.{ext}", lambda f, ext=ext: fig.savefig(
                f, format=ext, metadata={"CreationDate": None} if ext == "pdf" else None))])
    except fileio.FileIOError as e:
        raise TableError(str(e)) from None
    finally:
        plt.close(fig)
    return [out / f"{name}.png", out / f"{name}.pdf"]


def row_name(row) -> str:
    return " / ".join(map(str, row.group))


def curve(runs, metric: str, x: str):
    """(x, mean, std) over the runs of one group, on the evaluations all of them have."""
    key = f"rs_{metric}"
    series = [np.asarray(r.series[key], dtype=float) for r in runs if key in r.series]
    if not series or all(np.all(np.isnan(s)) for s in series):
        return None
    n = min(len(s) for s in series)
    ys = np.stack([s[:n] for s in series]) * (100 if metric in PERCENT else 1)
    rounds = np.asarray(runs[0].series["rs_round"][:n], dtype=float)
    if x == "time":
        per_run = []
        for r in runs:
            times = np.asarray(r.meta.get("round_time_s") or r.series.get("rs_round_time", []), dtype=float)
            cum = np.concatenate([[0.0], np.cumsum(times)])
            per_run.append(cum[np.minimum(rounds.astype(int), len(cum) - 1)])
        xs = np.mean(per_run, axis=0)
    else:
        xs = rounds
    return xs, np.nanmean(ys, axis=0), np.nanstd(ys, axis=0)


def plot_curves(inputs: list[str], group_keys: list[str], metrics: list[str], x: str, out: Path,
                incomplete: bool = False) -> list[Path]:
    runs = load_runs(inputs, incomplete)
    rows = aggregate(runs, group_keys)
    written = []
    with plt.rc_context(STYLE):
        for metric in metrics:
            fig, ax = plt.subplots()
            drawn = 0
            for row in rows:
                c = curve(row.runs, metric, x)
                if c is None:
                    continue
                xs, mean, std = c
                label = f"{row_name(row)} (n={len(row.runs)})"
                (line,) = ax.plot(xs, mean, label=label, marker="o" if len(xs) <= 12 else None, ms=3)
                if len(row.runs) > 1:
                    ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
                drawn += 1
            if not drawn:
                plt.close(fig)
                print(f"note: no run recorded {metric}; no figure", file=sys.stderr)
                continue
            ax.set_xlabel("wall time (s)" if x == "time" else "round")
            if x == "round":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(LABELS.get(metric, metric))
            ax.legend(fontsize=9)
            written += save(fig, out, f"{metric}_vs_{x}")
    return written


def plot_clients(inputs: list[str], group_keys: list[str], out: Path, incomplete: bool = False) -> list[Path]:
    runs = load_runs(inputs, incomplete)
    rows = [r for r in aggregate(runs, group_keys) if all("rs_client_test_acc" in run.series for run in r.runs)]
    if not rows:
        raise TableError("no run recorded rs_client_test_acc")
    data = [np.concatenate([100 * np.asarray(run.series["rs_client_test_acc"])[-1] for run in r.runs]) for r in rows]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(rows) + 2), 4.2))
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(rows) + 1), [row_name(r) for r in rows], rotation=30 if len(rows) > 4 else 0,
                      ha="right" if len(rows) > 4 else "center")
        ax.set_ylabel("client test accuracy at the final round (%)")
        ax.set_ylim(-2, 102)
        return save(fig, out, "client_accuracy")


QUANTILES = (0, 10, 50, 90, 100)  # worst, 10th percentile, median, 90th percentile, best client


def client_quantiles(runs) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, quantiles) of one group's per-client test accuracy (%) at every evaluation all its runs
    have: ``QUANTILES`` (numpy's linear interpolation) over the clients of every seed pooled, one row per
    evaluation."""
    n = min(len(r.series["rs_round"]) for r in runs)
    pooled = np.concatenate([100 * np.asarray(r.series["rs_client_test_acc"], dtype=float)[:n] for r in runs], axis=1)
    return np.asarray(runs[0].series["rs_round"][:n]), np.nanpercentile(pooled, QUANTILES, axis=1).T


def plot_spread(inputs: list[str], group_keys: list[str], out: Path, incomplete: bool = False) -> list[Path]:
    """Per group, the distribution of the clients' test accuracy over rounds: the median, the 10-90th
    percentile band and the worst-to-best band."""
    runs = load_runs(inputs, incomplete)
    rows = [r for r in aggregate(runs, group_keys) if all("rs_client_test_acc" in run.series for run in r.runs)]
    if not rows:
        raise TableError("no run recorded rs_client_test_acc")
    written = []
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots()
        for i, row in enumerate(rows):
            rounds, q = client_quantiles(row.runs)
            color = f"C{i % 10}"
            ax.fill_between(rounds, q[:, 0], q[:, 4], color=color, alpha=0.1, lw=0)
            ax.fill_between(rounds, q[:, 1], q[:, 3], color=color, alpha=0.25, lw=0)
            ax.plot(rounds, q[:, 2], color=color, label=row_name(row))
            ax.plot(rounds, q[:, 0], color=color, lw=0.8, ls=":")
        ax.set_xlabel("round")
        ax.set_ylabel("client test accuracy (%)")
        ax.set_title("median, 10-90th percentile (band), worst and best client (light band; worst dotted)",
                     fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=9)
        written += save(fig, out, "client_spread_vs_round")
    return written


def label_counts(split: Path, part: str) -> np.ndarray:
    """Clients x classes label counts of a split folder (``config.json``, ``train/<i>.npz``, ``test/<i>.npz``)."""
    from utils.data_utils import read_config
    from utils import fileio
    from utils.errors import FLError

    try:  # the split's schema (utils/data_utils.py), its files read through utils/fileio.py
        config, _ = read_config(split.name, split)
        n, k = config["num_clients"], config["num_classes"]
        counts = np.zeros((n, k), dtype=np.int64)
        parts = ["train", "test"] if part == "all" else [part]
        for i in range(n):
            for p in parts:
                y = fileio.read_npz(split / p / f"{i}.npz", ("y",), "client file")["y"]
                if y.ndim != 1 or y.dtype.kind not in "iu" or (len(y) and (y.min() < 0 or y.max() >= k)):
                    raise FLError(f"client file {split / p / f'{i}.npz'} holds labels that are not 0..{k - 1}")
                counts[i] += np.bincount(y.astype(np.int64), minlength=k)[:k]
    except FLError as e:
        raise TableError(" ".join(str(e).split())) from None
    return counts


def plot_split(name: str, root: Path, out: Path, part: str = "all") -> list[Path]:
    split = Path(name) if Path(name).is_dir() and (Path(name) / "config.json").exists() else root / name
    if not (split / "config.json").exists():
        raise TableError(f"split '{name}' not found (no config.json in {split})")
    counts = label_counts(split, part)
    n, k = counts.shape
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(min(12.0, 2.5 + 0.45 * k), min(12.0, 1.5 + 0.3 * n)))
        im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.grid(False)
        ax.set_xlabel("class")
        ax.set_ylabel("client")
        ax.set_xticks(range(k))
        ax.set_yticks(range(n) if n <= 40 else np.linspace(0, n - 1, 10, dtype=int))
        if n * k <= 400:
            top = counts.max() or 1
            for (i, j), v in np.ndenumerate(counts):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7, color="black" if v > 0.6 * top else "white")
        fig.colorbar(im, ax=ax, label="samples")
        ax.set_title(f"{split.name}: labels per client ({part})")
        return save(fig, out, f"split_{split.name}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("curves", help="metric vs round / wall time, mean ± std over seeds")
    c.add_argument("inputs", nargs="+")
    c.add_argument("--metrics", default="test_acc,train_loss", help="h5 series without rs_ (comma-separated)")
    c.add_argument("--x", default="round", choices=["round", "time"])
    b = sub.add_parser("clients", help="per-client final test accuracy, box per group")
    b.add_argument("inputs", nargs="+")
    d = sub.add_parser("spread", help="per-client test accuracy over rounds: median, percentile bands, worst")
    d.add_argument("inputs", nargs="+")
    for q in (c, b, d):
        q.add_argument("--group", default="algorithm", help="config keys that make a line/box (comma-separated)")
        q.add_argument("--incomplete", action="store_true", help="include runs that stopped before -gr")
    s = sub.add_parser("split", help="label distribution of a split (clients x classes)")
    s.add_argument("name", help="split folder name (under --dataset_root) or path")
    s.add_argument("--dataset_root", type=Path, default=REPO / "dataset")
    s.add_argument("--part", default="all", choices=["all", "train", "test"])
    for q in (c, b, d, s):
        q.add_argument("--out", type=Path, default=REPO / "results" / "figures",
                       help="folder for the PNG and PDF files (default: results/figures in the repository)")
    args = p.parse_args(argv)
    try:
        if args.what == "curves":
            metrics = [m.strip().removeprefix("rs_") for m in args.metrics.split(",") if m.strip()]
            paths = plot_curves(args.inputs, args.group.split(","), metrics, args.x, args.out, args.incomplete)
        elif args.what == "clients":
            paths = plot_clients(args.inputs, args.group.split(","), args.out, args.incomplete)
        elif args.what == "spread":
            paths = plot_spread(args.inputs, args.group.split(","), args.out, args.incomplete)
        else:
            paths = plot_split(args.name, args.dataset_root, args.out, args.part)
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0 if paths else 1


if __name__ == "__main__":
    sys.exit(main())
