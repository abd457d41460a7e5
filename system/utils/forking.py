"""Worker processes for ``--engine_workers`` (utils/engine.py): run per-client work in forked
single-thread processes and bring the results, or the clients' whole state, back."""
from __future__ import annotations

import queue
import traceback

import torch

from utils.errors import FLError


def balance(sizes: list[int], parts: int) -> list[list[int]]:
    """Positions 0..len(sizes)-1 split into at most ``parts`` groups of nearly equal total size (largest
    first, each to the lightest group)."""
    groups: list[list[int]] = [[] for _ in range(min(parts, len(sizes)))]
    load = [0] * len(groups)
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        g = load.index(min(load))
        groups[g].append(k)
        load[g] += sizes[k]
    return [sorted(g) for g in groups if g]


def _forked(fn, i: int, item, results) -> None:
    torch.set_num_threads(1)
    try:
        results.put((i, True, fn(item)))
    except Exception:  # noqa: BLE001 -- reported to the parent, which raises it
        results.put((i, False, traceback.format_exc()))


def fork_map(fn, items: list) -> list:
    """``[fn(item) for item in items]``, each call in its own forked single-thread process.

    Why processes: small kernels scale badly over OpenMP threads (every kernel ends in a barrier, and on
    a loaded machine a descheduled thread stalls the others), while independent processes scale with the
    cores. Why fork, per call: the children see the clients' data and models as they are, without
    copying or pickling anything; only ``fn``'s (small) results travel back, and tensors the parent
    moved to shared memory beforehand (the stacked parameters) are updated in place. CPU only (CUDA does
    not survive a fork; one GPU is one worker anyway)."""
    ctx = torch.multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_forked, args=(fn, i, item, results), daemon=True) for i, item in enumerate(items)]
    for proc in procs:
        proc.start()
    out: dict = {}
    while len(out) < len(items):
        try:
            i, ok, value = results.get(timeout=1)
        except queue.Empty:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                break
            continue
        if not ok:
            raise FLError(f"an --engine_workers process failed; rerun with --engine_workers 0 to see it here:\n"
                          f"{value}")
        out[i] = value
    for proc in procs:
        proc.join()
    if len(out) < len(items):
        raise FLError(f"an --engine_workers process died (exit codes {[p.exitcode for p in procs]}; out of "
                      f"memory?); rerun with fewer --engine_workers, or 0")
    return [out[i] for i in range(len(items))]


def fork_calls(method: str, calls: list, workers: int) -> list:
    """``[c.method(*args) for c, args in calls]`` over ``workers`` forked processes (balanced by
    training samples), each client's whole state then brought back (``checkpoint_state``): the same
    contract as a Ray executor's call (the client changes only through its methods; what it returns is a
    copy). For heavy per-client work with state changes: training outside the stack, ALA."""
    for c, _ in calls:
        if "parked_in" in vars(c):  # --client_state: back here first, so the state loaded below sticks
            vars(c)["parked_in"].unpark(c)
    groups = balance([c.train_samples for c, _ in calls], workers)

    def run(group):
        return [(getattr(calls[k][0], method)(*calls[k][1]), calls[k][0].checkpoint_state()) for k in group]

    out = [None] * len(calls)
    for group, results in zip(groups, fork_map(run, groups)):
        for k, (value, blob) in zip(group, results):
            calls[k][0].load_checkpoint_state(blob)
            out[k] = value
    return out


def plain_evaluation(client) -> bool:
    """True when evaluating ``client`` changes nothing on it (the base class's evaluation of its own
    model), so a forked process can do it: e.g. FedAvg-C's fine-tuned evaluation draws from a stream
    and caches its copy, and stays in this process."""
    from flcore.clients.clientbase import Client

    cls = type(client)
    return all(getattr(cls, m) is getattr(Client, m) for m in ("eval_model", "test_metrics", "train_metrics"))
