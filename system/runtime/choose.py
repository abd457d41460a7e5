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


def executor_kind(cfg) -> str:
    """``--executor auto``: the fork executor on a CPU with more than one core and more than one client
    (one single-thread worker per core beats one process with as many threads at PFLlib's small batches:
    docs/performance.md), else sequential (one GPU is one worker; CUDA does not survive a fork)."""
    if cfg.executor != "auto":
        return cfg.executor
    cpu = str(cfg.device) == "cpu"
    return "fork" if cpu and usable_cores() > 1 and (cfg.num_clients or 0) > 1 else "sequential"


def make_executor(cfg):
    """The executor ``--executor`` names (``auto``: see ``executor_kind``), parking clients with
    ``--client_state cpu|disk``."""
    parking = Parking.from_config(cfg)
    kind = executor_kind(cfg)
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
