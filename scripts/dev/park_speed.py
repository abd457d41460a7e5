"""What parking a client costs with ``--client_state disk``: seconds per park (its state written to its file)
and per unpark (read back, checked, loaded into a client its constructor built), for a client after one
trained round, and the file's size. Best of ``--repeat`` of each, in CPU seconds of this process (user +
system: what the step costs, not the machine's other load) and in wall seconds.

    python scripts/dev/park_speed.py -data MNIST_iid_c10 --dataset_root dataset -algo FedAvg FedALA
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from flcore.registry import get_server_class  # noqa: E402
from cli import parse_config  # noqa: E402
from runtime import loop  # noqa: E402
from utils import fileio  # noqa: E402
from utils.data_utils import DATASET_ROOT, load_split  # noqa: E402


def measure(dataset: str, root: str, algo: str, repeat: int) -> tuple[dict, int]:
    """({"park", "unpark"} -> (best CPU s, best wall s), file bytes) for client 0 of a one-round run of ``algo``."""
    tmp = str(fileio.make_private(tempfile.gettempdir(), "park-speed-", "temporary folder"))
    try:
        cfg = parse_config(["-data", dataset, "--dataset_root", root, "-algo", algo, "-dev", "cpu",
                            "--executor", "sequential", "--client_state", "disk", "--client_state_dir", tmp,
                            "--results_dir", tmp, "--no-progress", "--no-print_config"])
        data = load_split(cfg.dataset, cfg.dataset_root)
        cfg = cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients))
        server = get_server_class(algo)(cfg, data, 0, None)
        loop.run_round(server, 0)  # models, optimizers and extras as training leaves them
        host = server.executor.host
        store, client = host.store, host.clients[0]  # the client itself (the server holds a handle)
        if "parked_in" in vars(client):
            store.unpark(client)
        best = {"park": [float("inf")] * 2, "unpark": [float("inf")] * 2}
        size = 0
        for _ in range(repeat):
            for step in ("park", "unpark"):
                cpu, wall = time.process_time(), time.perf_counter()
                getattr(store, step)(client)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                best[step] = [min(best[step][0], cpu), min(best[step][1], wall)]
                if step == "park":
                    size = (store.folder / f"{client.id}.pt").stat().st_size
        server.executor.close()
    finally:
        fileio.remove_made(tmp)
    return best, size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-data", "--dataset", default="Digits")
    p.add_argument("--dataset_root", default=str(DATASET_ROOT))
    p.add_argument("-algo", "--algorithms", nargs="+", default=["FedAvg"])
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for algo in args.algorithms:
        best, size = measure(args.dataset, args.dataset_root, algo, args.repeat)
        print(f"{args.dataset} {algo}: " + ", ".join(f"{step} {1e3 * cpu:.1f} ms CPU ({1e3 * wall:.1f} wall)"
                                                    for step, (cpu, wall) in best.items())
              + f"; file {size / 1e6:.2f} MB (best of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
