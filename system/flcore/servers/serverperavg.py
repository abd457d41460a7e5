"""Per-FedAvg: Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach. Fallah, Mokhtari, Ozdaglar. NeurIPS 2020. https://arxiv.org/abs/2002.07948
No official code; PFLlib's ``PerAvg`` is the common reference.

Relative to FedAvg this changes the client's local step and its evaluation. Training (first-order
variant, Per-FedAvg (FO)): for each pair of fresh batches D, D',

    w' = w - α ∇f_i(w; D),    w ← w - β ∇f_i(w'; D'),

and the server averages the w's as FedAvg does. Evaluation uses the paper's personalisation: one step
w - α ∇f_i(w; D) on a local training batch, made on a copy (the federated state is untouched).

Flags: α = ``-lr``; ``-bt`` β = 0.001 (the value PFLlib's run scripts pass; PFLlib's default 0 would
freeze training). The Hessian-free variant (HF) is not implemented.

Where PFLlib differs, this follows the paper: PFLlib's second step updates w' rather than w (so its
step is w' - β ∇f(w')), and it personalises for evaluation on a *test* batch; here the outer step
updates w at the gradient taken at w', and personalisation uses a training batch.
"""
from flcore.clients.clientperavg import PerFedAvgClient
from flcore.servers.serverbase import Server
from utils.errors import FLError


class PerFedAvgServer(Server):
    client_class = PerFedAvgClient

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-bt", "--beta", type=float, default=0.001,
                            help="outer (meta) step size β; α is -lr (0.001 as in PFLlib's Per-FedAvg scripts)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.beta <= 0:
            raise FLError(f"-bt must be > 0 (got {cfg.beta})")
