"""Generate the Synthetic(alpha, beta) federated dataset of FedProx.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, after
Shamir et al. 2014. Client k has its own softmax-regression model and feature
distribution (60 features, 10 classes):

    u_k ~ N(0, alpha),  W_k ~ N(u_k, 1) [60 x 10],  b_k ~ N(u_k, 1) [10]
    B_k ~ N(0, beta),   v_k ~ N(B_k, 1) [60],       x ~ N(v_k, Sigma), Sigma_jj = j^-1.2
    y = argmax softmax(W_k^T x + b_k)

alpha controls how much the models differ, beta how much the features differ
(both used as the normal's scale, as in the FedProx reference code).
``--iid`` gives Synthetic-IID: one W, b ~ N(0, 1) and one zero feature mean for
all clients. Client sizes follow a lognormal power law: least_samples +
lognormal(4, 2), capped at --max-samples. Writes, next to this file (or under
``--root``)::

    Synthetic/train/<i>.npz, Synthetic/test/<i>.npz   x float32 [n, 60], y int64 [n]
    Synthetic/config.json                             every parameter, data checksum, per-client stats

Example and its expected summary (seed 1)::

    python dataset/generate_Synthetic.py --alpha-syn 1 --beta-syn 1

    client  train   test      0     1     2     3     4     5     6     7     8     9
         0     41     14      0     0     0     0     0     0    55     0     0     0
         1    119     40     58    50     0     2     0    49     0     0     0     0
         2     48     16      0     0    64     0     0     0     0     0     0     0
       ...
    total: 20 clients, 3487 samples (train 2617, test 870); client size min 40 max 681
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import dataset_utils as du  # noqa: E402
from dataset.utils.partition import split_train_test  # noqa: E402

DIM, NUM_CLASSES = 60, 10  # fixed by the FedProx setup


def client_sizes(num_clients, least_samples, max_samples, rng):
    """Power-law client sizes: least_samples + lognormal(4, 2), capped at max_samples."""
    return np.minimum(least_samples + rng.lognormal(4, 2, num_clients).astype(np.int64), max_samples)


def synthetic_clients(sizes, alpha, beta, iid, rng):
    """Draw every client's data; returns (xs, ys, models) with models[k] = (W_k, b_k).

    x is float32 [n, 60]; y is the argmax of x W_k + b_k computed from the stored
    float32 x (softmax does not change the argmax).
    """
    std = np.arange(1, DIM + 1) ** -0.6  # sqrt of Sigma_jj = j^-1.2
    shared = (rng.normal(0, 1, (DIM, NUM_CLASSES)), rng.normal(0, 1, NUM_CLASSES)) if iid else None
    xs, ys, models = [], [], []
    for n in sizes:
        if iid:
            (w, b), mean = shared, np.zeros(DIM)
        else:
            u, big_b = rng.normal(0, alpha), rng.normal(0, beta)
            w, b = rng.normal(u, 1, (DIM, NUM_CLASSES)), rng.normal(u, 1, NUM_CLASSES)
            mean = rng.normal(big_b, 1, DIM)
        x = (mean + rng.standard_normal((n, DIM)) * std).astype(np.float32)
        xs.append(x)
        ys.append(np.argmax(x.astype(np.float64) @ w + b, axis=1).astype(np.int64))
        models.append((w, b))
    return xs, ys, models


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    parser = du.common_parser("Generate FedProx's Synthetic(alpha, beta) data.", with_partition=False,
                              with_source=False, least_rule="int(10/(1-train_ratio))")
    parser.add_argument("--alpha-syn", type=float, default=1.0, help="model heterogeneity alpha (default 1)")
    parser.add_argument("--beta-syn", type=float, default=1.0, help="feature heterogeneity beta (default 1)")
    parser.add_argument("--iid", action="store_true", help="Synthetic-IID: all clients share W, b and v")
    parser.add_argument("--max-samples", type=int, default=1000, help="cap on a client's size (default 1000)")
    args = parser.parse_args(argv)
    du.check_common(parser, args)
    least = args.least_samples or int(10 / (1 - args.train_ratio))
    if args.max_samples < least:
        parser.error(f"--max-samples ({args.max_samples}) must be >= least samples ({least})")
    part_rng, split_rng = du.np_generators(args.seed)
    sizes = client_sizes(args.num_clients, least, args.max_samples, part_rng)
    xs, ys, _ = synthetic_clients(sizes, args.alpha_syn, args.beta_syn, args.iid, part_rng)
    x, y = np.concatenate(xs), np.concatenate(ys)
    root = Path(args.root).resolve() if args.root else du.DATASET_ROOT
    config = dict(dataset="Synthetic", num_clients=args.num_clients, num_classes=NUM_CLASSES, partition="synthetic",
                  alpha=None, class_per_client=None, balance=None, layout=None, train_ratio=args.train_ratio,
                  least_samples=least, seed=args.seed, source="generated", source_sha256=du.arrays_sha256(x, y),
                  input_shape=[DIM],
                  x_dtype="float32", normalize=None, class_names=None, format_version=du.FORMAT_VERSION,
                  iid=args.iid, alpha_syn=None if args.iid else args.alpha_syn,
                  beta_syn=None if args.iid else args.beta_syn, max_samples=args.max_samples)

    def make_split():
        starts = np.concatenate([[0], np.cumsum(sizes)])
        split = [split_train_test(np.arange(a, b), args.train_ratio, split_rng) for a, b in zip(starts, starts[1:])]
        return x, y, [s[0] for s in split], [s[1] for s in split]

    du.write_or_skip(root / (args.out or "Synthetic"), config, make_split, args.plot, args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(du.run_cli(main))
