"""Round-time benchmark: the executors side by side, and where a round's wall time goes.

    python scripts/run/benchmark.py -data MNIST -m CNN -algo FedAvg -gr 3                     # sequential vs fork
    python scripts/run/benchmark.py -data MNIST -m CNN -algo FedALA -gr 4 --executors fork --json out.json

Takes every flag of ``system/main.py`` (no result files; the split is generated, loaded and checked by main's
own ``set_up``, the server class is the registry's) plus ``--executors`` (default
``sequential,fork``: the single-process path and the CPU default, measured one after the other in the
same invocation on the same split and seed; ``sequential@1`` runs at one torch thread, the fork workers'
count, where the curves must be identical bit for bit), ``--steady_from`` and ``--ref_seconds``. Per round it prints
the wall time of each phase: send (the broadcast, with ALA or another local initialisation), evaluate,
train, aggregate (upload + aggregate), and the training throughput in samples/s and GFLOP/s (FLOPs counted
once by ``torch.utils.flop_counter`` on one batch). The reference, measured in this process before each
executor's run and after every round (outside the round's time: a shared machine's speed drifts), is one
model trained on batches of ``--ref_batch`` (200) for ``--ref_seconds`` in the faster weight layout: the
throughput small-batch federated training is compared with (with ``--ref_batch 10`` and ``NAME@1``, the
same batch-10 steps in one tight loop on one core, which each training process's share is compared with). At the end: each executor's mean round time from round
``--steady_from`` on (FedALA's start phase is its round 1), its ratio to the first executor's, whether the
accuracy and loss curves are identical, and the peak resident memory of the worker processes. Figures:
docs/performance.md.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import cli  # noqa: E402

import main  # noqa: E402
from flcore.registry import get_server_class  # noqa: E402
from flcore.trainmodel.models import build_model  # noqa: E402
from runtime.choose import make_executor  # noqa: E402
from runtime import loop  # noqa: E402
from utils import fileio  # noqa: E402
from utils.amp import autocast  # noqa: E402

PHASES = ("send", "evaluate", "train", "aggregate")


def flops_per_sample(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, train: bool) -> float:
    """FLOPs of one sample: forward (+ backward when ``train``) of a batch, divided by its size."""
    from torch.utils.flop_counter import FlopCounterMode

    model = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        if train:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        else:
            with torch.no_grad():
                model(x)
    return counter.get_total_flops() / len(y)


def reference_throughput(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, cfg, seconds: float,
                         batch: int = 200) -> float:
    """Samples per second of plain SGD on one model with batches of ``batch``, in the faster of the two
    weight layouts: the compute limit small-batch federated training is compared with."""
    return max(one_reference(copy.deepcopy(model).to(memory_format=fmt), x, y, cfg, seconds / 2, batch)
               for fmt in (torch.contiguous_format, torch.channels_last))


def one_reference(model, x, y, cfg, seconds: float, batch: int) -> float:
    model = model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.local_learning_rate)
    reps = -(-batch // len(y))
    xb, yb = x.repeat(reps, *[1] * (x.dim() - 1))[:batch], y.repeat(reps)[:batch]
    device = next(model.parameters()).device

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(cfg, device):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    sync(device)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    sync(device)
    return n * batch / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseLog(loop.PhaseTimer):
    """The loop's timer (``server.timer``, runtime/loop.py's seam) for one benchmarked run: each phase of a
    round timed (the loop's receive and aggregate together as ``aggregate``), the samples trained, each
    recorded evaluation added to the curve, and one line printed per round. With ``reference`` (a function
    returning samples per second), the reference is measured again after every round, outside the round's
    time, so that each round is compared with the machine as it was then."""

    def __init__(self, cfg, train_flops: float, reference=None):
        self.cfg, self.train_flops, self.reference = cfg, train_flops, reference
        self.device = torch.device(cfg.device)
        self.log, self.rounds, self.curve = {}, [], []
        self.clock = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, server, name: str, clients: list):
        if name == "train":
            self.log["samples"] = sum(c.train_samples for c in clients) * server.cfg.local_epochs
        column = "aggregate" if name == "receive" else name
        sync(self.device)
        start = time.perf_counter()
        yield
        sync(self.device)
        self.log[column] = self.log.get(column, 0.0) + time.perf_counter() - start

    def recorded(self, server, summary: dict) -> None:
        loss = summary["train_loss"]  # NaN under --train_loss_eval off: kept as None, so curves compare equal
        self.curve.append({"round": server.round_idx, "acc": summary["test_acc"],
                           "loss": None if loss != loss else loss})

    def round_done(self, server) -> None:
        now = time.perf_counter()
        log, cfg = self.log, self.cfg
        r = {"round": server.round_idx, "wall": now - self.clock, **{k: log.get(k, 0.0) for k in PHASES},
             "samples": log.get("samples", 0), "load": os.getloadavg()[0]}
        self.rounds.append(r)
        ref = ""
        if self.reference is not None:
            r["reference"] = self.reference()
            ref = f" | reference {r['reference']:.0f} samples/s: {100 * r['samples'] / r['train'] / r['reference']:.0f} %"
        self.log, self.clock = {}, time.perf_counter()
        print(f"{cfg.executor} round {r['round']}: {r['wall']:6.2f} s | "
              + " | ".join(f"{k} {r[k]:6.2f}" for k in PHASES)
              + f" | train {r['samples'] / r['train']:7.0f} samples/s = "
              f"{r['samples'] * self.train_flops / r['train'] / 1e9:5.1f} GFLOP/s{ref} | load {r['load']:.2f}", flush=True)


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process (Linux ``VmHWM``), MB; NaN where it cannot be read."""
    try:
        for line in fileio.read_proc(f"/proc/{pid}/status").decode().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def run_one(cfg, data, model, x, y, train_flops: float, ref_seconds: float, ref_batch: int = 200) -> dict:
    """One executor's run, instrumented; its figures."""
    def reference():
        return reference_throughput(model, x, y, cfg, ref_seconds, ref_batch)

    ref_before = reference()
    executor = make_executor(cfg)
    try:
        server = get_server_class(cfg.algorithm)(cfg, data, 0, None, executor=executor)
        server.timer = timer = PhaseLog(cfg, train_flops, reference)
        loop.train(server)
        final = time.perf_counter() - timer.clock
        workers = [peak_rss_mb(p.pid) for p in getattr(executor, "procs", [])]
    finally:
        executor.close()
    rounds = timer.rounds
    train_s = sum(r["train"] for r in rounds)
    samples = sum(r["samples"] for r in rounds)
    return {"executor": cfg.executor, "workers": len(workers), "rounds": rounds, "curve": timer.curve,
            "final_evaluation_s": final, "reference_before": ref_before,
            "train_samples_per_s": samples / train_s if train_s else float("nan"),
            "train_gflops": samples * train_flops / train_s / 1e9 if train_s else float("nan"),
            # each round against the reference measured right after it (the machine's speed drifts)
            "train_vs_reference_per_round": [r["samples"] / r["train"] / r["reference"] for r in rounds],
            "peak_rss_workers_mb": workers}


def steady_mean(rounds: list[dict], first: int) -> float:
    """Mean wall time of the rounds from ``first`` on (all rounds when there are none)."""
    walls = [r["wall"] for r in rounds if r["round"] >= first] or [r["wall"] for r in rounds]
    return sum(walls) / max(len(walls), 1)


def main_benchmark(argv=None) -> dict:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--executors", default="sequential,fork",
                   help="executors to run, one after the other; NAME@T runs this process at T torch threads "
                        "(fork workers always use one)")
    p.add_argument("--steady_from", type=int, default=1,
                   help="first round in the steady mean (FedALA's start phase is round 1: use 2)")
    p.add_argument("--ref_seconds", type=float, default=3.0, help="length of each reference measurement")
    p.add_argument("--ref_batch", type=int, default=200,
                   help="the reference's batch size (200: the compute limit; -lbs, e.g. 10, with NAME@1: the same "
                        "steps in one tight loop on one core, which each fork worker's share is compared with)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ours, rest = p.parse_known_args(argv)
    cfg, data = main.set_up(cli.parse_config(rest + ["--no-progress"]))
    device = torch.device(cfg.device)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.feature_dim, cfg.vocab_size).to(device)
    big = max(data.clients, key=lambda c: len(c.y_train))
    x, y = big.x_train[:cfg.batch_size], big.y_train[:cfg.batch_size]
    train_flops = flops_per_sample(model, x, y, train=True)
    eval_flops = flops_per_sample(model, x, y, train=False)
    runs = []
    for spec in ours.executors.split(","):
        kind, _, threads = spec.partition("@")  # sequential@1: this process at one torch thread
        before = torch.get_num_threads()
        torch.set_num_threads(int(threads or before))
        try:
            runs.append(run_one(cfg.replace(executor=kind), data, model, x, y, train_flops, ours.ref_seconds,
                                ours.ref_batch))
        finally:
            torch.set_num_threads(before)
        runs[-1].update(executor=spec, threads=int(threads or before))
    for r in runs:
        r["steady_round_s"] = steady_mean(r["rounds"], ours.steady_from)
        r["vs_first"] = r["steady_round_s"] / runs[0]["steady_round_s"]
        r["same_curve_as_first"] = r["curve"] == runs[0]["curve"]
        r["same_curve_as"] = [o["executor"] for o in runs if o is not r and o["curve"] == r["curve"]]
        # training throughput per process that trains (the workers, or this one) against the reference
        r["train_vs_reference_per_process"] = (sum(r["train_vs_reference_per_round"]) / len(r["rounds"])
                                               / max(r["workers"], 1)) if r["rounds"] else float("nan")
    out = {"config": {k: getattr(cfg, k) for k in ("dataset", "algorithm", "model", "num_clients", "join_ratio",
                                                    "batch_size", "local_epochs", "amp", "train_loss_eval",
                                                    "eval_batch_size", "device", "workers")},
           "threads": torch.get_num_threads(), "reference_batch": ours.ref_batch, "train_mflop_per_sample": train_flops / 1e6,
           "eval_mflop_per_sample": eval_flops / 1e6, "steady_from": ours.steady_from, "runs": runs,
           "peak_rss_mb": peak_rss_mb()}
    print(f"{cfg.algorithm} on {cfg.dataset}, {len(data.clients)} clients:")
    for r in runs:
        print(f"  {r['executor']:12s} threads {r['threads']}, workers {r['workers']}: mean round {r['steady_round_s']:.2f} s from round "
              f"{ours.steady_from} ({r['vs_first']:.2f}x {runs[0]['executor']}); training "
              f"{r['train_samples_per_s']:.0f} samples/s ({r['train_gflops']:.1f} GFLOP/s, "
              f"{', '.join(f'{100 * v:.0f}' for v in r['train_vs_reference_per_round'])} % of the reference round "
              f"by round; {100 * r['train_vs_reference_per_process']:.0f} % per training process); curve identical (bit for bit) to: {', '.join(r['same_curve_as']) or 'none'}; workers' peak "
              f"RSS {', '.join(f'{m:.0f}' for m in r['peak_rss_workers_mb']) or '-'} MB")
    print(f"  peak RSS of this process {out['peak_rss_mb']:.0f} MB")
    if ours.json:
        fileio.write_file(ours.json, json.dumps(out, indent=1, default=float), "--json")
    return out


if __name__ == "__main__":
    from utils.errors import FLError

    try:
        main_benchmark()
    except FLError as e:  # bad flags or split: main.py's one line and exit code
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
