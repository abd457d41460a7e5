"""FedProx: Federated Optimization in Heterogeneous Networks.
Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. MLSys 2020. https://arxiv.org/abs/1812.06127
Official code: https://github.com/litian96/FedProx

Relative to FedAvg this changes only the client's local objective: a proximal term keeps the local model w
near the global model w^t it received,

    min_w  F_i(w) + (mu / 2) ||w - w^t||^2     (gradient: ∇F_i(w) + mu (w - w^t)),

solved with the same ``-ls`` epochs of SGD. Upload and server aggregation are FedAvg's; ``-mu 0`` is
FedAvg number for number. With ``-ala`` the local model is initialised by ALA and the anchor w^t stays
the received global model.

Flags: ``-mu`` mu = 0.01. The paper tunes mu per dataset over {0.001, 0.01, 0.1, 1}; PFLlib's default
``-mu 0`` silently runs FedAvg, so the default here is a value from the paper's grid.
The paper's partial-work (variable local epochs for stragglers) part is not modelled: every client runs
``-ls`` epochs.
"""
from flcore.clients.clientprox import FedProxClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


class FedProxServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Li et al., MLSys 2020, [arXiv 1812.06127](https://arxiv.org/abs/1812.06127)",
        family="traditional FL, proximal local objective",
        flags="`-mu` 0.01",
        ala="yes: the local model; the proximal anchor stays the global model")
    declares = Declares(
        client_class=FedProxClient,
        pfllib_defaults={"mu": 0.0},
        personalized=False,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-mu", "--mu", type=float, default=0.01,
                            help="proximal weight mu (FedProx paper grid {0.001, 0.01, 0.1, 1}; 0 = FedAvg)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.mu < 0:
            raise FLError(f"-mu must be >= 0 (got {cfg.mu})")
