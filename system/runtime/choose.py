"""Choosing the executor a run uses (``--executor``, ``--workers``, ``--client_state``)."""
from __future__ import annotations

import os

from runtime.executors import Parking, SequentialExecutor
from runtime.fork import ForkExecutor
from runtime.raypool import RayExecutor
from utils.errors import FLError


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def executor_kind(cfg, client_class: type | None = None) -> str:
    """``--executor auto``: the fork executor on a CPU with more than one core and more than one client
    (one single-thread worker per core beats one process with as many threads at PFLlib's small batches:
    docs/performance.md); on CUDA the batched executor when the algorithm (``client_class``) and the flags
    allow it (runtime/batched.py), else sequential (one GPU is one worker; CUDA does not survive a fork)."""
    if cfg.executor != "auto":
        return cfg.executor
    cpu = str(cfg.device) == "cpu"
    if cpu:
        return "fork" if usable_cores() > 1 and (cfg.num_clients or 0) > 1 else "sequential"
    if str(cfg.device).startswith("cuda") and client_class is not None and "," not in cfg.device_id:
        from runtime.batched import batch_refusal, config_refusal

        if not batch_refusal(client_class) and not config_refusal(cfg):
            return "batched"
    return "sequential"


def make_executor(cfg, client_class: type | None = None, auto: bool = False):
    """The executor ``--executor`` names (``auto``: see ``executor_kind``; ``client_class``: the algorithm's
    client, which says whether it batches; ``auto``: ``cfg.executor`` was resolved from auto), parking
    clients with ``--client_state cpu|disk``."""
    parking = Parking.from_config(cfg)
    kind = executor_kind(cfg, client_class)
    if kind == "batched":
        from runtime.batched import BatchedExecutor

        return BatchedExecutor(cfg, parking, auto=auto or cfg.executor == "auto")
    if kind == "ray":
        return RayExecutor(cfg, parking)
    if kind == "fork":
        if str(cfg.device) != "cpu":
            raise FLError("--executor fork runs on the CPU (CUDA does not survive a fork); on GPUs use "
                          "--executor ray or sequential")
        return ForkExecutor(cfg.workers or usable_cores(), parking)
    if "," in cfg.device_id and str(cfg.device).startswith("cuda"):  # -did as parsed: indices, no spaces
        print(f"note: the sequential executor uses one device ({cfg.device}); add --executor ray to place "
              f"clients on all of -did {cfg.device_id}")
    return SequentialExecutor(parking)
