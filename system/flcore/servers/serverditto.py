"""Ditto: Fair and Robust Federated Learning Through Personalization.
Li, Hu, Beirami, Smith. ICML 2021. https://arxiv.org/abs/2012.04221
Official code: https://github.com/litian96/ditto

Relative to FedAvg this adds a personal model v_i on each client, which is what gets evaluated. Each
round the client trains its copy w of the global model w^t exactly as FedAvg does (and uploads it), then
trains v_i for ``-pls`` epochs on its regularised local objective

    v_i ← v_i - η (∇F_i(v_i) + λ (v_i - w^t)).

The server is FedAvg's. Both accuracies are recorded, apart: ``rs_test_acc`` (and the other standard
series) is the personal models', ``rs_global_test_acc`` the received model w's (the global model; with
``-ala`` its ALA initialisation). PFLlib mixes both into one list. With ``-ala`` ALA initialises w; the
anchor w^t stays the global model.

Flags: ``-mu`` λ = 1 (PFLlib's flag name for Ditto's λ). The paper (App. C) lets each device pick λ on
its validation data, from {0.1, 1, 2} unless attacks are strong, and fixes λ = 1 where a device has too
little validation data to choose; PFLlib's default 0 would cut v loose from the federation.
``-pls`` personal epochs per round = 1 (PFLlib's default, in place of the paper's s local iterations).
"""
import numpy as np

from flcore.clients.clientditto import DittoClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


class DittoServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Li et al., ICML 2021, [arXiv 2012.04221](https://arxiv.org/abs/2012.04221)",
        family="pFL, regularised personal model",
        flags="`-mu` λ 1, `-pls` 1",
        ala="yes: the local copy w of the global model; the personal model v is untouched")
    declares = Declares(
        client_class=DittoClient,
        pfllib_defaults={"mu": 0.0, "plocal_epochs": 1},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-mu", "--mu", type=float, default=1.0,
                            help="λ, pull of the personal model toward the global model (Ditto paper, App. C: 1)")
        parser.add_argument("-pls", "--plocal_epochs", type=int, default=1,
                            help="personal-model epochs per round (PFLlib: 1)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.mu < 0 or cfg.plocal_epochs < 1:
            raise FLError(f"Ditto needs -mu >= 0 and -pls >= 1 (got {cfg.mu}, {cfg.plocal_epochs})")

    def extra_metrics(self) -> dict:
        counts = np.array(self.call_clients(self.clients, "received_test_metrics"), dtype=np.float64)
        return {"global_test_acc": float(counts[:, 0].sum() / max(counts[:, 1].sum(), 1))}
