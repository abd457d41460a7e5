"""What validating a split on load costs: per client, the checked read (``utils.data_utils``) against a
bare ``np.load`` of the same files (opened by the I/O layer: a regular file, no header checked), best of
``--repeat`` passes.

    python scripts/dev/split_load_cost.py -data FMNIST_dir0.1_s2000
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from utils import fileio  # noqa: E402
from utils.data_utils import DATASET_ROOT, _read_npz, read_config  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-data", "--dataset", default="Digits")
    p.add_argument("--dataset_root", default=str(DATASET_ROOT))
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    d = Path(args.dataset_root) / args.dataset
    config, _ = read_config(args.dataset, d)
    files = [(d / part / f"{i}.npz", part, i) for i in range(config["num_clients"]) for part in ("train", "test")]

    def bare():
        for path, _, _ in files:
            with fileio.open_read(path, "client file", cap=fileio.NPZ_CAP) as fh, np.load(fh, allow_pickle=False) as f:
                f["x"], f["y"]

    def checked():
        for path, part, i in files:
            _read_npz(args.dataset, path, config, part, i)

    best = {"bare": float("inf"), "checked": float("inf")}
    bare()  # files in the page cache for both
    for _ in range(args.repeat):  # interleaved, so drift in the machine's speed hits both alike
        for name, fn in (("bare", bare), ("checked", checked)):
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    n = config["num_clients"]
    print(f"{args.dataset}: {n} clients; bare np.load {1e3 * best['bare'] / n:.2f} ms/client, checked read "
          f"{1e3 * best['checked'] / n:.2f} ms/client, validation {1e3 * (best['checked'] - best['bare']) / n:+.2f} ms/client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
