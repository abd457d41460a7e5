"""``-dp``: differential privacy. This plug-in holds the flags both levels share and, at the sample level (the
default), DP-SGD on every client (utils/dp_sgd.py; the client's ``dp_backward``): it reports each client's
epsilon at every evaluation and refuses a client that trained without a DP-SGD step. The client level is
plugins/dp_client.py. What an algorithm refuses, and what its epsilon leaves out, is its server's
``dp_support`` (utils/dp_support.py)."""
from __future__ import annotations

import sys

from plugins import Plugin
from utils.dp_support import check_support, sample_level, uncovered_steps
from utils.errors import FLError, require


class SampleDP(Plugin):
    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("differential privacy (any algorithm that does not refuse it): DP-SGD and DP-FedAvg, "
                              "see docs/privacy.md")
        g.add_argument("-dp", "--privacy", action="store_true",
                       help="DP-SGD local training: per-sample clipping and Gaussian noise (PFLlib's flag)")
        g.add_argument("-dps", "--dp_sigma", type=float, default=1.0,
                       help="noise multiplier sigma (PFLlib's flag; PFLlib: 0.0, no noise); with "
                            "--dp_level client the multiplier z of the server's noise N(0, z^2 S^2 / m^2)")
        g.add_argument("--dp_clip", type=float, default=1.0,
                       help="per-sample L2 clip norm C (Abadi et al. 2016: 4); with --dp_level client the clip norm S "
                            "of each client's model update (its initial value with --dp_quantile)")
        g.add_argument("--dp_level", default="sample", choices=["sample", "client"],
                       help="sample: DP-SGD on every client (record-level privacy); client: DP-FedAvg (McMahan et al. "
                            "2018), the server clips each client's update to --dp_clip and adds Gaussian noise to their "
                            "unweighted mean (client-level privacy)")
        g.add_argument("--dp_delta", type=float, default=1e-5, help="delta of the reported (epsilon, delta)")
        g.add_argument("--dp_secure_rng", action="store_true",
                       help="seed the DP noise from the OS (secrets) instead of -seed, as a deployment needs (anyone "
                            "with the seed can remove seeded noise); results are then not reproducible")

    @classmethod
    def check(cls, cfg, server_cls, given):
        checks = [
            (not cfg.privacy or cfg.dp_sigma > 0, "-dps must be > 0 with -dp (sigma 0 adds no noise: drop -dp)"),
            (cfg.privacy or not cfg.dp_secure_rng, "--dp_secure_rng needs -dp"),
            (cfg.privacy or cfg.dp_level == "sample", "--dp_level client needs -dp"),
            (cfg.amp != "fp16" or not cfg.privacy, "--amp fp16 does not combine with -dp; use --amp bf16 or off"),
        ]
        require(checks)
        if cfg.privacy:
            import importlib.util

            if importlib.util.find_spec("opacus") is None:
                raise FLError("-dp reports epsilon with opacus' RDP accountant, which is not installed: "
                              "pip install -r requirements-optional.txt")
        if server_cls is not None:
            check_support(cfg, server_cls)  # the algorithm's privacy declaration
        return cfg

    @classmethod
    def build(cls, cfg, server):
        if not sample_level(cfg):
            return None
        if server.run == cfg.prev:
            steps = uncovered_steps(cfg, type(server))
            if steps:
                print(f"warning: -dp: {cfg.algorithm}'s epsilon does not cover: {'; '.join(steps)} "
                      f"(see docs/privacy.md)", file=sys.stderr)
        return cls()

    @classmethod
    def setup_client(cls, cfg, client) -> None:
        """The client's DP-SGD noise stream and accountant (``client.dp``), read by ``dp_backward``."""
        if cfg.privacy:
            from utils.dp_sgd import DPSGD

            client.dp = DPSGD.from_config(cfg, client.id, client.run, client.model, client.train_samples)

    def __init__(self):
        self.trained: set[int] = set()  # ids of the clients that have trained in this run

    def before_training(self, server, active):
        self.trained.update(c.id for c in active)

    def describe(self, summary: dict) -> tuple[str, str]:
        return "", f" | DP epsilon max {summary['dp_epsilon_max']:.3f}"

    def metrics(self, server, tests, trains) -> dict:
        """Epsilon of every client at ``--dp_delta`` (0 before it trains); the server prints the maximum with
        the round's accuracy. A client that trained under ``-dp`` without a single DP-SGD step (an algorithm
        whose training bypasses the DP path) is an error: its epsilon of 0 would claim privacy the run did not
        give."""
        import numpy as np

        cfg, clients = server.cfg, server.clients
        eps = np.array(server.call_clients(clients, dp_epsilon, cfg.dp_delta))
        bare = [c.id for c, e in zip(clients, eps) if c.id in self.trained and not e > 0]
        if bare:
            raise FLError(f"-dp: client {bare[0]} trained but its DP accountant is empty: {cfg.algorithm}'s "
                          f"training bypassed DP-SGD, so the run is not private (a bug: refuse -dp in its check_config)")
        return {"dp_epsilon_max": float(eps.max()), "dp_epsilon_mean": float(eps.mean()), "dp_client_epsilon": eps}


def dp_epsilon(client, delta: float) -> float:
    """Epsilon (at ``delta``) of ``client``'s DP-SGD steps so far; 0.0 without ``-dp`` or before it trains.
    Run where the client lives (``server.call_clients(clients, dp_epsilon, delta)``)."""
    return 0.0 if client.dp is None else client.dp.epsilon(delta)
