"""``-dp --dp_level client``: DP-FedAvg with fixed or adaptive clipping (utils/dp_client.py), a wrapper around
the server's aggregation step as Flower's DP strategy wrappers wrap a strategy: each upload's update is
clipped against the global model, their mean over the selected clients noised, and the algorithm's
``aggregate`` runs on that release. The flags both DP levels share are plugins/dp_sample.py's."""
from __future__ import annotations

from plugins import Plugin
from utils.dp_support import client_level
from utils.errors import require


class ClientDP(Plugin):
    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("client-level differential privacy (-dp --dp_level client)")
        g.add_argument("--dp_quantile", type=float, default=None,
                       help="--dp_level client: adaptive clipping (Andrew et al. 2021) towards this quantile of the "
                            "update norms (their gamma, e.g. 0.5) (default: off, a fixed clip norm)")

    @classmethod
    def check(cls, cfg, server_cls, given):
        checks = [
            (cfg.dp_quantile is None or (cfg.privacy and cfg.dp_level == "client"),
             "--dp_quantile (adaptive clipping) needs -dp --dp_level client"),
        ]
        require(checks)
        return cfg

    @classmethod
    def build(cls, cfg, server):
        if not client_level(cfg):
            return None
        from utils.dp_client import ClientLevelDP

        return cls(ClientLevelDP(cfg, server.run))

    def __init__(self, dp):
        self.dp = dp  # the clipping, noise stream and accountant history

    def on_broadcast(self, server, payloads):
        """One model is released per round: a broadcast that sends clients different models is refused."""
        self.dp.check_broadcast(server.cfg.algorithm, payloads)

    def wrap_aggregate(self, server, step):
        def private(uploads):
            self.dp.aggregate(step, server.cfg.algorithm, uploads, server.global_model, len(server.selected),
                              len(server.clients))
        return private

    def describe(self, summary: dict) -> tuple[str, str]:
        return "", f" | DP epsilon max {summary['dp_epsilon_max']:.3f}"

    def metrics(self, server, tests, trains) -> dict:
        """One client-level epsilon, the same for every client."""
        import numpy as np

        e = self.dp.epsilon(server.cfg.dp_delta)
        return {"dp_epsilon_max": e, "dp_epsilon_mean": e, "dp_client_epsilon": np.full(len(server.clients), e),
                "dp_clip_norm": self.dp.clip}
