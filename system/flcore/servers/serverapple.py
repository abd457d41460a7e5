"""APPLE: Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning.
Luo, Wu. IJCAI 2022. https://arxiv.org/abs/2110.08394
Official code: https://github.com/ljaiverson/pFL-APPLE

Relative to FedAvg there is no global model. Each client i uploads a core model θ_i and keeps a directed
relationship vector p_i (one weight per client). Its personalised model mixes the downloaded core models,

    θ̃_i = Σ_j p_ij θ_j,    min_{θ_i, p_i}  CE(θ̃_i) + λ(r) (μ/2) ||p_i - p^0||^2,

trained by SGD on θ_i (rate -lr; its gradient is p_ii ∇_θ̃ L) and on p_i (rate -dlr; ∂L/∂p_ij = <∇_θ̃ L, θ_j>),
the other cores fixed. p^0 (also p_i's start) holds the clients' shares of the training samples, so the
first personalised model is FedAvg's; λ(r) decays to 0 over the first -L fraction of the rounds. The server
only stores the latest core of every client and sends all of them.

Flags (official code's defaults): ``-dlr`` 0.001, ``-mu`` μ = 0.1, ``-L`` 0.1, ``--lambda_schedule``
cosine (the official code also offers ``exponential``, its default), ``--core_lr_scale`` 1 (the core's
rate is -lr times this; its gradient carries the factor p_ii ~ 1/N, which PFLlib offsets with N).
Plain SGD (the official code uses momentum 0.9); p_i is unconstrained, as there. The limited-bandwidth
variant (download M cores) is not implemented. ``-ala`` is rejected: no single global model is received.

Where PFLlib differs: it scales the core's learning rate by N (``--core_lr_scale N``), starts p_i at 1/N,
replaces the inner product <∇L, θ_j> by a mean of per-tensor means, and its defaults ``-dlr 0 -mu 0``
freeze p_i.
"""
import torch

from flcore.clients.clientapple import APPLEClient
from flcore.servers.serverbase import Server
from utils.errors import FLError


class APPLEServer(Server):
    client_class = APPLEClient

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-dlr", "--dr_learning_rate", type=float, default=0.001,
                            help="learning rate of the relationship vector p (official code: 0.001)")
        parser.add_argument("-mu", "--mu", type=float, default=0.1,
                            help="weight μ of the proximal term on p (official code: 0.1)")
        parser.add_argument("-L", "--L", type=float, default=0.1,
                            help="fraction of the rounds over which λ(r) decays to 0 (official code: 0.1)")
        parser.add_argument("--lambda_schedule", default="cosine", choices=["cosine", "exponential"],
                            help="shape of λ(r) (both in the official code)")
        parser.add_argument("--core_lr_scale", type=float, default=1.0,
                            help="factor on -lr for the core model, whose gradient is scaled by p_ii ~ 1/N "
                                 "(paper and official code: 1; PFLlib: N)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.ala:
            raise FLError("-ala needs a received global model; APPLE's personalised model is a learned mix of "
                          "the clients' core models, so drop -ala")
        if cfg.dr_learning_rate < 0 or cfg.mu < 0 or not 0 <= cfg.L <= 1 or cfg.core_lr_scale <= 0:
            raise FLError("APPLE needs -dlr >= 0, -mu >= 0, 0 <= -L <= 1 and --core_lr_scale > 0")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init = {k: v.detach().clone() for k, v in self.global_model.state_dict().items()}
        self.cores = [init] * len(self.clients)  # θ_j as last uploaded (all start from the common init)
        n = torch.tensor([float(c.train_samples) for c in self.clients])
        self.p0 = n / n.sum()  # p^0: the clients' shares of the training samples

    def prepare_broadcast(self, participants) -> None:
        self.payload = {"cores": list(self.cores), "p0": self.p0}  # one object: pickled once per worker

    def broadcast(self, client) -> dict:
        """Every client gets all core models (and p^0) and rebuilds its personalised model."""
        return self.payload

    def aggregate(self, uploads) -> None:
        for u in uploads:
            self.cores[u.id] = {k: v.detach().clone() for k, v in u.state.items()}
