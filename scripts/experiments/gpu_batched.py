"""The GPU check of ``--executor batched`` (docs/performance.md, "Many clients on one GPU"): one command,
everything it needs in the tree, a time budget it keeps.

    python scripts/experiments/gpu_batched.py --out results/gpu_batched         # on a CUDA machine (about 6 min)
    python scripts/experiments/gpu_batched.py --dev cpu --small --out /tmp/dry  # the same steps, small, on the CPU

Steps, most important first (``plan``), each skipped (and said so in the JSON) once it no longer fits in
``--budget`` seconds:

1. full-scale MNIST Dir(0.1), 20 clients (``dataset/generate_MNIST.py --source MNIST_NPZ``), the 4-layer CNN,
   batch 10, one local epoch, -lr 0.005, full evaluation every round: seconds per round and training
   samples/s (``scripts/run/benchmark.py``'s timer on the loop: phases timed, a batch-200 reference after
   every round, the utilisation being training samples/s over it) of FedAvg, FedALA, Ditto and FedRep
   (``-pls 1``: PFLlib's default) on the batched executor with CUDA graphs;
2. PFLlib's own FedAvg (its repository's ``system/`` under ``--pfllib``, not part of this repository) on the
   same split written in its file format, its own "time cost" per round parsed from its output;
3. FedAvg on the sequential executor;
4. peak GPU memory of one batched FedAvg round (training and full evaluation) with 20, 100 and 500 clients
   of CIFAR-10's shape (synthetic: 50,000 training and 10,000 test images split evenly, labels at random),
   500 also with ``--batch_clients 100``;
5. FedAvg and FedALA batched without CUDA graphs; Ditto and FedRep sequential;
6. worker processes sharing the GPU (``--executor ray --gpus_per_worker 1/W``, W = 2, 4), where Ray is
   installed;
7. FedALA sequential to its steady round 2 (its start phase alone took 53 s on an H200).

Writes ``<out>/gpu_batched.json`` (everything measured, the errors of steps that failed, the GPU's name,
the torch and Python versions) and prints one summary table. Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

ALGOS = ("FedAvg", "FedALA", "Ditto", "FedRep")
# Ditto's and FedRep's personal epochs at PFLlib's default (1; FedRep's paper uses 10 head epochs, which would
# make its sequential round alone outlast the check)
OWN = {"FedAvg": (), "FedALA": (), "Ditto": ("-pls", "1"), "FedRep": ("-pls", "1")}


class Clock:
    """The run's time budget: a step starts only when its estimate fits in what is left."""

    def __init__(self, budget: float):
        self.start, self.budget = time.perf_counter(), budget

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)


def generate_split(args) -> str:
    name = "MNIST_dir0.1_s1500" if args.small else "MNIST_dir0.1"
    cmd = [sys.executable, str(REPO / "dataset" / "generate_MNIST.py"), "--partition", "dir", "--alpha", "0.1",
           "--num-clients", "20", "--seed", "1", "--out", name, "--source", str(args.mnist), "--root", str(args.root)]
    if args.small:
        cmd += ["--subsample", "1500"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"split generation failed: {out.stderr.strip().splitlines()[-1:]}")
    print(out.stdout.strip().splitlines()[-1])
    return name


def flags(args, split: str, algo: str, rounds: int) -> list[str]:
    return ["-data", split, "--dataset_root", str(args.root), "-dev", args.dev, "-m", "CNN", "-algo", algo,
            "-lbs", "10", "-lr", "0.005", "-gr", str(rounds), "--no-progress", "--no-print_config"]


def library_run(args, split: str, algo: str, executor: str, rounds: int, extra=()) -> dict:
    """One executor's run through scripts/run/benchmark.py (its per-round phases and reference)."""
    from scripts.run import benchmark
    import cli
    import main
    import torch
    from flcore.trainmodel.models import build_model

    cfg, data = main.set_up(cli.parse_config(flags(args, split, algo, rounds) + ["--executor", executor, *extra]))
    device = torch.device(cfg.device)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.feature_dim, cfg.vocab_size).to(device)
    big = max(data.clients, key=lambda c: len(c.y_train))
    x, y = big.x_train[:cfg.batch_size], big.y_train[:cfg.batch_size]
    train_flops = benchmark.flops_per_sample(model, x, y, train=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    made, make = [], benchmark.make_executor  # keep the executor, to report whether its CUDA graphs held

    def keep(cfg):
        made.append(make(cfg))
        return made[-1]

    benchmark.make_executor = keep
    try:
        run = benchmark.run_one(cfg, data, model, x, y, train_flops, args.ref_seconds)
    finally:
        benchmark.make_executor = make
    graphs = getattr(made[0], "graphs", None) if made else None
    run["cuda_graphs"] = None if graphs is None else {"captured": len(graphs.cache), "failed": graphs.broken}
    steady = 2 if algo == "FedALA" and rounds > 2 else min(1, rounds - 1)
    run["steady_from"] = steady
    run["steady_round_s"] = benchmark.steady_mean(run["rounds"], steady)
    useful = [r["samples"] / r["train"] for r in run["rounds"] if r["round"] >= steady and r["train"]]
    run["steady_train_samples_per_s"] = sum(useful) / len(useful) if useful else float("nan")
    run["utilisation_vs_reference"] = [r["samples"] / r["train"] / r["reference"] for r in run["rounds"] if r["train"]]
    if device.type == "cuda":
        run["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    run.update(algorithm=algo, executor=executor, flags=list(extra))
    return run


# ---- PFLlib on the same split ------------------------------------------------------------------------------
def write_pfllib_split(args, split: str) -> Path:
    """The split in PFLlib's file format (``dataset/<name>/train|test/<i>.npz``, a pickled dict of x and y,
    images normalised as its generators store them) beside its ``system/``."""
    import numpy as np
    from utils import fileio
    from utils.data_utils import load_split

    data = load_split(split, args.root, None, "cpu")
    target = args.pfllib.parent / "dataset" / split
    base = fileio.Folder(args.pfllib.parent / "dataset", what="PFLlib's dataset folder")
    parts = {part: base.sub(f"{split}/{part}") for part in ("train", "test")}
    for i, c in enumerate(data.clients):
        # this library loads pixels as x/255 (utils/data_utils); PFLlib's MNIST stores (x/255 - 0.5) / 0.5
        for part, x, y in (("train", c.x_train, c.y_train), ("test", c.x_test, c.y_test)):
            arrays = {"x": ((x.numpy() - 0.5) / 0.5).astype(np.float32), "y": y.numpy()}
            parts[part].replace([(f"{i}.npz", lambda f, arrays=arrays: np.savez_compressed(f, data=arrays))])
    return target


# PFLlib's main.py imports every algorithm; these two packages are used by none that this check runs (FedPAC's
# solver, the memory report's number format) and stand in as stubs when absent, so its FedAvg runs anyway.
PFLLIB_RUNNER = """
import importlib.util, runpy, sys, types
stubbed = []
for name in ("cvxpy", "calmsize"):
    if importlib.util.find_spec(name) is None:
        stub = types.ModuleType(name)
        stub.size = float
        sys.modules[name] = stub
        stubbed.append(name)
print("stubbed:", ",".join(stubbed) or "none", flush=True)
sys.argv = ["main.py", *sys.argv[1:]]
runpy.run_path("main.py", run_name="__main__")
"""


def pfllib_run(args, split: str, rounds: int, timeout: float) -> dict:
    write_pfllib_split(args, split)
    cmd = [sys.executable, "-c", PFLLIB_RUNNER, "-data", split, "-m", "CNN", "-algo", "FedAvg", "-gr", str(rounds), "-did", "0",
           "-dev", "cuda" if args.dev == "cuda" else "cpu", "-nc", "20", "-ncl", "10", "-lbs", "10", "-lr", "0.005",
           "-eg", "1"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=args.pfllib, capture_output=True, text=True, timeout=timeout)
    times = [float(t) for t in re.findall(r"time cost -+ ([0-9.eE+-]+)", out.stdout)]
    accs = [float(a) for a in re.findall(r"Averaged Test Accuracy: ([0-9.]+)", out.stdout)]
    stubbed = re.findall(r"stubbed: (\S+)", out.stdout)
    return {"command": "python main.py " + " ".join(cmd[3:]), "returncode": out.returncode, "round_s": times,
            "test_acc": accs, "stubbed_imports": stubbed[0] if stubbed else None,
            "steady_round_s": sum(times[1:]) / len(times[1:]) if len(times) > 1 else (times[0] if times else None),
            "wall_s": time.perf_counter() - start, "stderr_tail": out.stderr.strip().splitlines()[-3:]}


# ---- memory with many clients ------------------------------------------------------------------------------
def memory_run(args, split: str, clients: int, group: int = 0, executor: str = "batched") -> dict:
    """Peak GPU memory of one round (training + full evaluation) of FedAvg with ``clients`` clients of
    CIFAR-10's shape (3x32x32, 10 classes), synthetic data, the CNN, batch 10; ``group``: --batch_clients."""
    import cli
    import torch
    from flcore.servers.serveravg import FedAvgServer
    from runtime import loop
    from utils.data_utils import ClientData, FederatedData

    train, test = (5000, 1000) if args.small else (50000, 10000)
    device = torch.device(args.dev)
    gen = torch.Generator().manual_seed(clients)
    per_train, per_test = train // clients, test // clients
    datas = []
    for _ in range(clients):
        x = torch.rand(per_train + per_test, 3, 32, 32, generator=gen)
        y = torch.randint(0, 10, (per_train + per_test,), generator=gen)
        datas.append(ClientData(x[:per_train].to(device), y[:per_train].to(device), x[per_train:].to(device),
                                y[per_train:].to(device)))
    data = FederatedData("Cifar10_synthetic", {"num_classes": 10, "input_shape": [3, 32, 32]}, "synthetic", datas)
    cfg = cli.parse_config(flags(args, split, "FedAvg", 1) + ["--executor", executor, "--batch_clients", str(group)])
    cfg = cfg.replace(num_classes=10, num_clients=clients)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    server = FedAvgServer(cfg, data, 0, None)
    loop.run_round(server, 0)
    loop.evaluate(server)
    out = {"clients": clients, "batch_clients": group, "executor": executor, "train_samples": per_train * clients,
           "round_s": time.perf_counter() - start}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        out.update(peak_allocated_mb=torch.cuda.max_memory_allocated(device) / 2**20,
                   peak_reserved_mb=torch.cuda.max_memory_reserved(device) / 2**20,
                   data_mb=base / 2**20)
    loop.close(server)
    del server, data, datas
    return out


# ---- the driver ---------------------------------------------------------------------------------------------
def plan(args, split: str, steps: set[str]) -> list[tuple]:
    """(name, seconds it needs about, function, report key) of every step, the most important first: the
    batched executor with graphs, PFLlib, the sequential FedAvg round, memory, the batched executor without
    graphs, the other sequential runs, worker processes; FedALA's sequential start phase (about 50 s) last."""
    cuda = args.dev == "cuda"
    rounds = 3 - args.small
    out = []
    if "batched" in steps:
        out += [(f"{a} batched", 25, lambda a=a: library_run(args, split, a, "batched", rounds + (a == "FedALA"), OWN[a]),
                 "library") for a in ALGOS]
    if "pfllib" in steps and args.pfllib.exists():
        out.append(("PFLlib FedAvg", 45, lambda: pfllib_run(args, split, 1, 120), "pfllib"))
    if "sequential" in steps:
        out.append(("FedAvg sequential", 30, lambda: library_run(args, split, "FedAvg", "sequential", 2), "library"))
    for spec in args.clients.split(",") if "memory" in steps else ():
        n, _, k = spec.partition(":")
        out.append((f"memory {n} clients, --batch_clients {k or 0}", 15 if int(n) < 500 else 30,
                    lambda n=int(n), k=int(k or 0): memory_run(args, split, n, k), "memory"))
    if "batched" in steps and cuda:
        out += [(f"{a} batched --no-cuda_graphs", 30,
                 lambda a=a: library_run(args, split, a, "batched", rounds + (a == "FedALA"),
                                         (*OWN[a], "--no-cuda_graphs")), "library") for a in ("FedAvg", "FedALA")]
    if "sequential" in steps:
        out += [(f"{a} sequential", 35, lambda a=a: library_run(args, split, a, "sequential", 1, OWN[a]), "library")
                for a in ("Ditto", "FedRep")]
    if "workers" in steps and importlib.util.find_spec("ray") is not None:
        for w in [w for w in (2, 4) if w <= (os.cpu_count() or 1)]:  # a Ray worker takes a CPU
            share = ("--gpus_per_worker", f"{1 / w:.4f}") if cuda else ()
            out.append((f"FedAvg ray {w} workers", 50,
                        lambda w=w, share=share: library_run(args, split, "FedAvg", "ray", 2, ("--workers", str(w), *share)),
                        "workers"))
    if "sequential" in steps:
        out.append(("FedALA sequential", 80, lambda: library_run(args, split, "FedALA", "sequential", 3), "library"))
    return out


# ---- running the steps --------------------------------------------------------------------------------------------
def step(report: dict, clock: Clock, name: str, estimate: float, fn):
    """Run ``fn`` if ``estimate`` seconds fit in the budget; its result or its error goes into the report."""
    if clock.left() < estimate:
        report["skipped"].append(f"{name} (needs about {estimate:.0f} s, {clock.left():.0f} s left)")
        print(f"skip {name}: {clock.left():.0f} s left", flush=True)
        return None
    print(f"== {name} ({clock.left():.0f} s left)", flush=True)
    t = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001  (one failed step must not cost the others)
        report["errors"].append({"step": name, "error": f"{type(e).__name__}: {e}",
                                 "trace": traceback.format_exc().splitlines()[-6:]})
        print(f"   failed: {type(e).__name__}: {e}", flush=True)
        return None
    print(f"   {time.perf_counter() - t:.1f} s", flush=True)
    return out


def summary(report: dict) -> str:
    lines = ["| algorithm | executor | steady s/round | training samples/s | utilisation vs batch-200 | accuracy by round |",
             "|---|---|---|---|---|---|"]
    for r in report["library"]:
        util = r.get("utilisation_vs_reference") or []
        accs = ", ".join(f"{100 * c['acc']:.2f}" for c in r.get("curve", []))
        lines.append(f"| {r['algorithm']} | {r['executor']} {' '.join(r['flags'])} | {r['steady_round_s']:.3f} | "
                     f"{r['steady_train_samples_per_s']:.0f} | {100 * (util[-1] if util else float('nan')):.1f} % | "
                     f"{accs} |")
    p = report.get("pfllib")
    if p and p.get("steady_round_s"):
        accs = ", ".join(f"{100 * a:.2f}" for a in p.get("test_acc", []))
        lines.append(f"| FedAvg | PFLlib | {p['steady_round_s']:.3f} | - | - | {accs} |")
    for m in report["memory"]:
        lines.append(f"memory, {m['clients']} CIFAR-10-shaped clients (--batch_clients {m['batch_clients']}): peak "
                     f"{m.get('peak_allocated_mb', float('nan')):.0f} "
                     f"MB allocated, {m.get('peak_reserved_mb', float('nan')):.0f} MB reserved, round {m['round_s']:.2f} s")
    return "\n".join(lines)


def main_check(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_batched.json")
    p.add_argument("--dev", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the same steps")
    p.add_argument("--small", action="store_true",
                   help="a 1,500-image split, 5,000 synthetic images, fewer rounds (the dry run)")
    p.add_argument("--budget", type=float, default=330.0, help="seconds; steps that would not fit are skipped")
    p.add_argument("--mnist", type=Path, default=REPO / ".gpu" / "mnist.npz", help="MNIST as ../shared/data holds it")
    p.add_argument("--pfllib", type=Path, default=REPO / ".gpu" / "pfllib" / "system", help="PFLlib's system/ folder")
    p.add_argument("--root", type=Path, default=REPO / ".gpu" / "dataset", help="where the split is written")
    p.add_argument("--ref_seconds", type=float, default=0.5, help="each batch-200 reference measurement")
    p.add_argument("--clients", default="20,100,500,500:100",
                   help="client counts of the memory step (N:K stacks at most K at a time, --batch_clients K)")
    p.add_argument("--steps", default="batched,pfllib,sequential,memory,workers",
                   help="which steps to run (comma-separated, in this order whatever the order given)")
    args = p.parse_args(argv)
    import torch

    from utils import fileio

    clock = Clock(args.budget)
    out_folder = fileio.Folder(args.out, what="--out")
    report = {"python": sys.version.split()[0], "torch": torch.__version__, "device": args.dev, "small": args.small,
              "library": [], "memory": [], "errors": [], "skipped": [], "pfllib": None, "workers": []}
    if args.dev == "cuda":
        if not torch.cuda.is_available():
            print("error: no CUDA device: this check needs a GPU (or --dev cpu for a dry run)", file=sys.stderr)
            return 2
        report["gpu"] = torch.cuda.get_device_name(0)
        report["gpu_memory_mb"] = torch.cuda.get_device_properties(0).total_memory / 2**20
    print(f"python {report['python']}, torch {report['torch']}, {report.get('gpu', args.dev)}", flush=True)
    steps = set(args.steps.split(","))
    split = generate_split(args)
    if "pfllib" in steps and not args.pfllib.exists():
        report["skipped"].append(f"PFLlib: no {args.pfllib}")
    if "workers" in steps and importlib.util.find_spec("ray") is None:
        report["skipped"].append("worker processes: Ray is not installed")
    result = "gpu_batched.json"
    try:
        for name, estimate, fn, kind in plan(args, split, steps):
            out = step(report, clock, name, estimate, fn)
            if out is not None:
                report[kind] = out if kind == "pfllib" else report[kind] + [out]
                if kind == "workers":
                    report["library"].append(out)
            report["elapsed_s"] = time.perf_counter() - clock.start
            # after every step: a cut run keeps it
            fileio.write_bytes(out_folder, result, json.dumps(report, indent=1, default=float).encode())
    except KeyboardInterrupt:  # the wrapper's time limit (SIGINT): what was measured is already written
        report["skipped"].append("interrupted by the time limit")
    report["elapsed_s"] = time.perf_counter() - clock.start
    fileio.write_bytes(out_folder, result, json.dumps(report, indent=1, default=float).encode())
    print(summary(report))
    print(f"errors: {len(report['errors'])}, skipped: {report['skipped']}, {report['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main_check())
