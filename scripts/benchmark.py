"""Round-time benchmark: where a round's wall time goes, against what the device can do.

    python scripts/benchmark.py -data MNIST -m CNN -algo FedAvg -gr 3 -lbs 10 --engine batched
    python scripts/benchmark.py -data MNIST -m CNN -algo FedALA -gr 3 --engine sequential --json out.json

Takes every flag of ``system/main.py`` (one run, no result files) plus ``--ref_seconds``. Per round it
prints the wall time of each phase: send (the broadcast, with ALA or another local initialisation),
evaluate, train, aggregate (receive + aggregate); training samples per second and the GFLOP/s they
amount to (FLOPs counted once by ``torch.utils.flop_counter`` on one batch). The reference, measured in
the same process on the same device before the first round, after every round (outside the round's
time: each round is compared with the reference measured right after it, as a shared machine's speed
drifts) and after the last one, is one model trained on
batches of 200 for ``--ref_seconds`` (in the faster of the contiguous and channels-last layouts): the
throughput small-batch federated training is compared with.
Last: peak RSS and, on CUDA, peak allocated device memory. See docs/performance.md for figures.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system"))

import main  # noqa: E402
from flcore.registry import get_server_class  # noqa: E402
from flcore.trainmodel.models import build_model, set_memory_format  # noqa: E402
from utils.data_utils import load_split  # noqa: E402
from utils.engine import autocast  # noqa: E402

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
                         batch: int = 200) -> tuple[float, float]:
    """(samples per second, samples per CPU second) of plain SGD on one model with batches of ``batch``,
    in the faster of the two weight layouts: the compute limit small-batch federated training is
    compared with."""
    best = (0.0, 0.0)
    for layout in ("contiguous", "channels_last"):
        m = set_memory_format(copy.deepcopy(model), layout, x.device)
        best = max(best, one_reference(m, x, y, cfg, seconds / 2, batch))
    return best


def one_reference(model, x, y, cfg, seconds: float, batch: int) -> tuple[float, float]:
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
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    sync(device)
    return n * batch / (time.perf_counter() - start), n * batch / max(time.process_time() - cpu, 1e-9)


def reference_one_thread(model, x, y, cfg, seconds: float) -> float:
    """Samples per CPU second of the reference on one thread (the yardstick for CPU-time figures)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return reference_throughput(model, x, y, cfg, seconds)[1]
    finally:
        torch.set_num_threads(threads)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def instrumented(server_cls: type, cfg, train_flops: float, reference=None) -> type:
    """``server_cls`` with each phase of a round timed and one line printed per round (the round loop
    itself is the library's: ``Server.run_rounds`` calls ``after_round`` last in every round). With
    ``reference`` (a function returning samples per second), the reference is measured again after every
    round, outside the round's time, so that each round is compared with the machine as it was then."""

    class Timed(server_cls):
        def timed(self, phase: str, fn, *args):
            sync(self.device)
            start, cpu = time.perf_counter(), cpu_seconds()
            out = fn(*args)
            sync(self.device)
            self.bench_log[phase] = self.bench_log.get(phase, 0.0) + time.perf_counter() - start
            self.bench_log[f"{phase}_cpu"] = self.bench_log.get(f"{phase}_cpu", 0.0) + cpu_seconds() - cpu
            return out

        def send_models(self, participants):
            return self.timed("send", super().send_models, participants)

        def evaluate(self):
            return self.timed("evaluate", super().evaluate)

        def train_clients(self, clients):
            self.bench_log["samples"] = sum(c.train_samples for c in clients) * cfg.local_epochs
            return self.timed("train", super().train_clients, clients)

        def receive_models(self, clients):
            return self.timed("aggregate", super().receive_models, clients)

        def aggregate(self, uploads):
            return self.timed("aggregate", super().aggregate, uploads)

        def record(self, summary):
            super().record(summary)
            self.bench_curve.append({"round": self.round_idx, "acc": summary["test_acc"],
                                     "loss": summary["train_loss"]})

        def after_round(self):
            super().after_round()
            now = time.perf_counter()
            log = self.bench_log
            r = {"round": self.round_idx, "wall": now - self.bench_clock, **{k: log.get(k, 0.0) for k in PHASES},
                 **{f"{k}_cpu": log.get(f"{k}_cpu", 0.0) for k in PHASES},
                 "samples": log.get("samples", 0), "load": os.getloadavg()[0]}
            self.bench_rounds.append(r)
            ref = ""
            if reference is not None:
                r["reference"] = reference()
                ref = f" | reference {r['reference']:.0f} samples/s: {100 * r['samples'] / r['train'] / r['reference']:.0f} %"
            self.bench_log, self.bench_clock = {}, time.perf_counter()
            print(f"round {r['round']}: {r['wall']:6.2f} s | " + " | ".join(f"{k} {r[k]:6.2f}" for k in PHASES)
                  + f" | train {r['samples'] / r['train']:7.0f} samples/s = "
                  f"{r['samples'] * train_flops / r['train'] / 1e9:5.1f} GFLOP/s ({r['samples'] / r['train_cpu']:.0f} "
                  f"samples/CPU-s){ref} | load {r['load']:.2f}", flush=True)

    return Timed


def peak_rss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (forked workers): on a shared machine
    the figure that load inflates least, unlike wall time."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main_benchmark(argv=None) -> dict:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--ref_seconds", type=float, default=5.0, help="length of each reference measurement")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ours, rest = p.parse_known_args(argv)
    cfg = main.resolve_device(main.parse_config(rest + ["--no-progress"]))
    data = load_split(cfg.dataset, cfg.dataset_root, cfg.num_clients, cfg.device)
    cfg = cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients))
    device = torch.device(cfg.device)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.feature_dim, cfg.vocab_size).to(device)
    big = max(data.clients, key=lambda c: len(c.y_train))
    x, y = big.x_train[:cfg.batch_size], big.y_train[:cfg.batch_size]
    train_flops = flops_per_sample(model, x, y, train=True)
    eval_flops = flops_per_sample(model, x, y, train=False)
    load = [os.getloadavg()[0]]
    ref_before, _ = reference_throughput(model, x, y, cfg, ours.ref_seconds)
    ref_cpu = reference_one_thread(model, x, y, cfg, ours.ref_seconds) if device.type == "cpu" else float("nan")

    def reference():
        return reference_throughput(model, x, y, cfg, ours.ref_seconds)[0]

    server = instrumented(get_server_class(cfg.algorithm), cfg, train_flops, reference)(cfg, data, 0, None)
    server.bench_log, server.bench_rounds, server.bench_curve = {}, [], []
    start = server.bench_clock = time.perf_counter()
    server.train()
    end = time.perf_counter()
    load.append(os.getloadavg()[0])
    ref_after, _ = reference_throughput(model, x, y, cfg, ours.ref_seconds)
    ref = (ref_before + ref_after) / 2
    per_round = server.bench_rounds
    train_s = sum(r["train"] for r in per_round)
    train_cpu = sum(r["train_cpu"] for r in per_round)
    samples = sum(r["samples"] for r in per_round)
    out = {
        "config": {k: getattr(cfg, k) for k in ("dataset", "algorithm", "model", "num_clients", "join_ratio",
                                                 "batch_size", "local_epochs", "engine", "engine_stack", "amp",
                                                 "train_loss_eval", "eval_batch_size", "device")},
        "threads": torch.get_num_threads(), "rounds": per_round, "curve": server.bench_curve,
        "mean_round_s": sum(r["wall"] for r in per_round) / max(len(per_round), 1),
        "final_evaluation_s": end - server.bench_clock,  # the evaluation after the last round
        "train_samples_per_s": samples / train_s if train_s else float("nan"),
        "train_gflops": samples * train_flops / train_s / 1e9 if train_s else float("nan"),
        "train_mflop_per_sample": train_flops / 1e6, "eval_mflop_per_sample": eval_flops / 1e6,
        "reference_b200_samples_per_s": [ref_before, ref_after],
        "reference_gflops": ref * train_flops / 1e9,
        "train_vs_reference": (samples / train_s) / ref if train_s else float("nan"),
        # each round against the reference measured right after it (the machine's speed drifts)
        "train_vs_reference_per_round": [r["samples"] / r["train"] / r["reference"] for r in per_round],
        "train_samples_per_cpu_s": samples / train_cpu if train_cpu else float("nan"),
        "reference_1thread_samples_per_cpu_s": ref_cpu,
        "train_cpu_vs_reference": (samples / train_cpu) / ref_cpu if train_cpu else float("nan"),
        "peak_rss_mb": peak_rss_mb(), "peak_rss_children_mb": peak_rss_mb(resource.RUSAGE_CHILDREN),
        "load_before_after": load,
    }
    if device.type == "cuda":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    print(f"mean round {out['mean_round_s']:.2f} s over {len(per_round)} round(s); training "
          f"{out['train_samples_per_s']:.0f} samples/s ({out['train_gflops']:.1f} GFLOP/s, "
          f"{train_flops / 1e6:.1f} MFLOP/sample); reference batch-200 {ref_before:.0f} / {ref_after:.0f} "
          f"samples/s before / after ({out['reference_gflops']:.1f} GFLOP/s): training at "
          f"{100 * out['train_vs_reference']:.0f} % of it (round by round: "
          f"{', '.join(f'{100 * v:.0f}' for v in out['train_vs_reference_per_round'])} %); peak RSS {out['peak_rss_mb']:.0f} MB"
          + (f", peak CUDA {out['peak_cuda_mb']:.0f} MB" if "peak_cuda_mb" in out else "")
          + f" (workers {out['peak_rss_children_mb']:.0f} MB); load average {load[0]:.2f} -> {load[1]:.2f}; "
          f"{torch.get_num_threads()} thread(s)\nCPU time: training {out['train_samples_per_cpu_s']:.0f} samples/CPU-s, "
          f"reference on one thread {ref_cpu:.0f} samples/CPU-s: {100 * out['train_cpu_vs_reference']:.0f} %")
    if ours.json:
        Path(ours.json).write_text(json.dumps(out, indent=1, default=float))
    return out


if __name__ == "__main__":
    main_benchmark()
