"""``--server_opt``: the server steps the averaged model as a pseudo-gradient (the optimizers, one function
each: plugins/optimizers.py), inside ``Server.average_uploads``, after the aggregation rule."""
from __future__ import annotations

import sys

from plugins import Plugin, registered
from utils.errors import FLError

OPTIMIZERS = registered("optimizers", "optimizer")  # name -> {"lr": default}, read without torch


class ServerOpt(Plugin):
    averages = True

    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("server optimizers (any algorithm whose server averages a model; README: Server "
                              "optimizers)")
        g.add_argument("--server_opt", default="off", choices=["off", *OPTIMIZERS],
                       help="step the averaged model as a pseudo-gradient, g = global - aggregate (Reddi et al. "
                            "2021; avgm: FedAvgM, Hsu et al. 2019); off: the aggregate is the new model")
        lrs = "; ".join(f"{v['lr']:g} {k}" for k, v in OPTIMIZERS.items())
        g.add_argument("-slr", "--server_learning_rate", type=float, default=None,
                       help=f"server learning rate η (PFLlib's flag): --server_opt's step size, SCAFFOLD's and "
                            f"FedGH's server step (default: {lrs}; 1 SCAFFOLD and FedGH)")
        g.add_argument("--server_momentum", type=float, default=0.9,
                       help="--server_opt β1 of avgm, adagrad, adam, yogi (Reddi et al. and Hsu et al.: 0.9)")
        g.add_argument("--server_beta2", type=float, default=0.99,
                       help="--server_opt β2 of adam and yogi (Reddi et al.: 0.99)")
        g.add_argument("--server_tau", type=float, default=1e-3,
                       help="--server_opt adaptivity τ of adagrad, adam, yogi (Reddi et al.'s grid 1e-5..1e-1)")

    @classmethod
    def check(cls, cfg, server_cls, given):
        if cfg.server_opt != "off" and server_cls.declares.averaging_refusal:
            raise FLError(f"--server_opt: {cfg.algorithm} cannot take it: {server_cls.declares.averaging_refusal}")
        lr = cfg.server_learning_rate
        if cfg.server_opt != "off":
            lr = OPTIMIZERS[cfg.server_opt]["lr"] if lr is None else lr
        elif server_cls.declares.slr_default is not None:
            lr = server_cls.declares.slr_default if lr is None else lr
        elif lr is not None:
            shown = "-slr" if "-slr" in given else "--server_learning_rate"
            print(f"warning: -algo {cfg.algorithm} does not use {shown} without --server_opt; ignored", file=sys.stderr)
            lr = None
        return cfg.replace(server_learning_rate=lr)

    @classmethod
    def build(cls, cfg, server):
        if cfg.server_opt == "off":
            return None
        from plugins.optimizers import ServerOptimizer

        return cls(ServerOptimizer(cfg.server_opt, cfg.server_learning_rate, cfg.server_momentum, cfg.server_beta2,
                                   cfg.server_tau))

    def __init__(self, optimizer):
        self.optimizer = optimizer  # its per-entry state m, v is checkpointed with the server's

    def step(self, server, current, aggregate, params):
        return self.optimizer.step(current, aggregate, params)
