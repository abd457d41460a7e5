"""Mean ± std over runs of the best and of the last-round test accuracy, one line per configuration.

    python system/get_mean_std.py results/MNIST_FedALA_test_*.h5
    python system/get_mean_std.py results/benchmark            # a folder: one line per algorithm / dataset

Takes ``.h5`` result files or their ``.json`` sidecars (globs, folders). Runs are grouped by algorithm
(with "+ALA") and dataset, so different algorithms are never averaged into one mean; runs of one group that
differ in another flag are still averaged, with a warning naming the flag (``scripts/run/table.py`` groups by
any keys and writes tables).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def _load_table():
    """scripts/run/table.py, the tool this one is a preset of, loaded from its file (no search-path edit)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "run" / "table.py"
    spec = importlib.util.spec_from_file_location("table", path)
    module = sys.modules.get("table")
    if module is not None and Path(getattr(module, "__file__", "")).resolve() == path:
        return module
    module = importlib.util.module_from_spec(spec)
    sys.modules["table"] = module
    spec.loader.exec_module(module)
    return module


table = _load_table()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="result .h5 / .json files, globs or folders, one file per run")
    p.add_argument("--incomplete", action="store_true", help="include runs that stopped before -gr")
    args = p.parse_args(argv)
    try:
        runs = table.load_runs(args.files, incomplete=args.incomplete)
        keys = ["algorithm", "dataset"]
        rows = table.aggregate(runs, keys)
    except table.TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for warning in table.check_rows(rows, keys):
        print(f"warning: {warning}", file=sys.stderr)
    for row in rows:
        (bm, bs, _, n), (lm, ls, _, _) = row.stats["best"], row.stats["last"]
        print(f"{row.group[0]} on {row.group[1]}, {n} runs: best {bm:.2f} ± {bs:.2f}, last {lm:.2f} ± {ls:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
