"""Mean ± std over runs of the best and of the last-round test accuracy, one line per configuration.

    python system/get_mean_std.py results/MNIST_FedALA_test_*.h5
    python system/get_mean_std.py results/benchmark            # a folder: one line per algorithm / dataset

Takes ``.h5`` result files or their ``.json`` sidecars (globs, folders). Runs are grouped by algorithm
(with "+ALA") and dataset, so different algorithms are never averaged into one mean; runs of one group that
differ in another flag are still averaged, with a warning naming the flag (``scripts/run/table.py`` groups by
any keys and writes tables; both read and group through ``utils/summary.py``).
"""
from __future__ import annotations

import argparse
import sys

import cli
from flcore.registry import ALGORITHMS
from utils.summary import TableError, aggregate, check_rows, load_runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="result .h5 / .json files, globs or folders, one file per run")
    p.add_argument("--incomplete", action="store_true", help="include runs that stopped before -gr")
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.files, incomplete=args.incomplete)
        keys = ["algorithm", "dataset"]
        rows = aggregate(runs, keys, order=list(ALGORITHMS))
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    common = {a.dest for a in cli.base_parser().flags if a.option_strings}  # as scripts/run/table.py
    for warning in check_rows(rows, keys, common=common):
        print(f"warning: {warning}", file=sys.stderr)
    for row in rows:
        (bm, bs, _, n), (lm, ls, _, _) = row.stats["best"], row.stats["last"]
        print(f"{row.group[0]} on {row.group[1]}, {n} runs: best {bm:.2f} ± {bs:.2f}, last {lm:.2f} ± {ls:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
