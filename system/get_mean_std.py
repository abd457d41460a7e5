"""Mean ± std over runs of the best and of the last-round test accuracy.

    python system/get_mean_std.py results/MNIST_FedALA_test_*.h5
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from utils.results import mean_std_over_runs  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="result .h5 files, one per run")
    args = p.parse_args(argv)
    missing = [f for f in args.files if not Path(f).exists()]
    if missing:
        print(f"error: no such result file: {missing[0]}", file=sys.stderr)
        return 2
    s = mean_std_over_runs(args.files)
    print(f"{s['runs']} runs: best {100 * s['best_mean']:.2f} ± {100 * s['best_std']:.2f}, "
          f"last {100 * s['last_mean']:.2f} ± {100 * s['last_std']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
