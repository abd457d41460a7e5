"""Why FedCP sits at the majority-class accuracy in the quick protocol: its features collapse at -lr 0.05.

    python scripts/dev/fedcp_collapse.py -data FMNIST_dir0.1_s2000 --rates 0.05,0.005 --rounds 3

Runs FedCP (its defaults, λ 5) on the split, sequentially, for a few rounds at each rate, and after each
round (and for the initial model) prints, for the averaged (global) feature extractor on every client's test images pooled: the mean
pairwise squared distance of the features (how far apart the inputs still are in feature space), the
squared norm of the personal heads' outputs averaged over clients, the test accuracy of the personalised
models and the share of each client's test predictions that are its majority training class (1.0 = a
constant output). docs/benchmark.md's quick-protocol notes quote its figures.
"""
from __future__ import annotations

import argparse
import sys

import torch

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401


def features_spread(base: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        h = base(x)
    return float(torch.cdist(h, h).pow(2).mean())


def diagnose(argv: list[str], rounds: int) -> list[dict]:
    import cli
    from flcore.registry import get_server_class
    from runtime import loop
    from runtime.executors import SequentialExecutor
    from utils.data_utils import load_split

    cfg = cli.parse_config(["-algo", "FedCP", "--executor", "sequential", "--no-progress", "--no-print_config",
                            "-dev", "cpu", *argv])
    data = load_split(cfg.dataset, cfg.dataset_root, cfg.num_clients, "cpu")
    cfg = cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients), global_rounds=rounds)
    server = get_server_class("FedCP")(cfg, data, 0, None, executor=SequentialExecutor())
    probe = torch.cat([c.x_test for c in server.clients])
    rows = [{"round": 0, "spread": features_spread(server.global_model.base.eval(), probe)}]
    server.global_model.base.train()
    for t in range(rounds):
        loop.run_round(server, t)
        summary = loop.evaluate(server)
        majority, out_norm = [], []
        for c in server.clients:
            c.model.eval()
            with torch.no_grad():
                h = c.model.base(c.x_test)
                out = c.model.heads(h)
                _, s = c.model.policy(h)
                out_norm.append(float(c.model.phead(h * s).pow(2).sum(1).mean()))
            c.model.train()
            top = int(torch.bincount(c.y_train, minlength=data.num_classes).argmax())
            majority.append(float((out.argmax(1) == top).float().mean()))
        rows.append({"round": t + 1, "spread": features_spread(server.global_model.base.eval(), probe),
                     "phead_out_sq": sum(out_norm) / len(out_norm), "acc": summary["test_acc"],
                     "majority_share": sum(majority) / len(majority)})
        server.global_model.base.train()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0.05,0.005", help="client learning rates to compare")
    p.add_argument("--rounds", type=int, default=3)
    args, rest = p.parse_known_args(argv)
    torch.set_num_threads(1)
    for lr in args.rates.split(","):
        print(f"-lr {lr}")
        start, *rows = diagnose([*rest, "-lr", lr], args.rounds)
        print(f"  initial model: feature spread {start['spread']:.4f}")
        for r in rows:
            print(f"  after round {r['round']}: feature spread {r['spread']:.4f}, personal-head output² "
                  f"{r['phead_out_sq']:.3f}, accuracy {r['acc']:.4f}, majority-class share {r['majority_share']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
