"""APFL: Adaptive Personalized Federated Learning.
Deng, Kamani, Mahdavi. arXiv 2020. https://arxiv.org/abs/2003.13461
Official code: https://github.com/MLOPTPSU/FedTorch

Relative to FedAvg this adds, on every client i, a personal model v_i and a mixing weight α_i; the
personalised model, the one evaluated, is the mixture v̄_i = α_i v_i + (1 - α_i) w_i. The server and the
shared model w are FedAvg's. Each local step on a batch ξ (Algorithm 1, with the paper's adaptive α):

    w_i ← w_i - η ∇f_i(w_i; ξ)
    v_i ← v_i - η ∇_v f_i(v̄_i; ξ) = v_i - η α_i ∇f_i(v̄_i; ξ)
    α_i ← Π_[0,1](α_i - η ∇_α f_i(v̄_i; ξ)),   ∇_α f_i(v̄_i) = <v_i - w_i, ∇f_i(v̄_i; ξ)>,

all from the values before the step. v_i and α_i never leave the client. With ``-ala`` ALA initialises
w_i from the global model; v_i and α_i are the client's own. ``-dp`` privatises the whole step: the
per-sample gradient of f_i(w_i) + f_i(v̄_i) (w_i, v_i and α_i together) is clipped and noised.

Flags: ``-al`` initial α = 0.5 (the official code's default; PFLlib's is 1.0, which starts from v
alone); ``--adapt_alpha`` (default on: the paper's adaptive α, the algorithm's name; the official code
defaults to a fixed α) learns α as above, ``--no-adapt_alpha`` keeps it fixed. α uses the local
learning rate, as in the paper and both codes. Learned with v's gradient scaled by α, α can reach 0 on
a client whose global model serves it best (IID data), after which v no longer moves: the
personalised model is then the global model, which the paper's bound favours when the local and
global distributions are close.

Where the official code differs: the mixture is of the two models' outputs, α f(x; v) + (1 - α) f(x; w),
not of their parameters; α is updated once per round (at the first step), with the gradient
approximation PFLlib copies (next).
Where PFLlib's clientapfl differs: v is trained on its own loss f(v) rather than on the mixture's; α's
gradient uses α ∇f(v) + (1 - α) ∇f(w), each at its own point, rather than ∇f at the mixture, plus a
0.02 α term (both taken from the official code), at every step; v is overwritten by the mixture after
every round; the personalised model's train loss is evaluated in train mode (BatchNorm statistics move
during evaluation). None of that is repeated here: this follows the paper's parameter mixture.
"""
import argparse

import numpy as np

from flcore.clients.clientapfl import APFLClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


class APFLServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Deng, Kamani, Mahdavi, 2020, [arXiv 2003.13461](https://arxiv.org/abs/2003.13461)",
        family=("pFL, personalised model α v + (1 − α) w with α learned per client (the paper's exact gradient ⟨v "
                "− w, ∇f(v̄)⟩, projected to [0, 1])"),
        flags="`-al` α 0.5 (official code), `--adapt_alpha` on",
        ala="yes: the local copy w of the global model; v and α untouched")
    declares = Declares(
        client_class=APFLClient,
        pfllib_defaults={"alpha": 1.0},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-al", "--alpha", type=float, default=0.5,
                            help="initial mixing weight α of the personal model, in [0, 1] (APFL official code: "
                                 "0.5; PFLlib: 1.0)")
        parser.add_argument("--adapt_alpha", action=argparse.BooleanOptionalAction, default=True,
                            help="learn α by gradient descent on the mixture's loss (the APFL paper's adaptive α)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if not 0.0 <= cfg.alpha <= 1.0:
            raise FLError(f"-al must be in [0, 1] (got {cfg.alpha})")

    def extra_metrics(self) -> dict:
        alphas = np.array(self.call_clients(self.clients, "mixing_weight"), dtype=np.float64)
        return {"alpha_mean": float(alphas.mean()), "alpha_std": float(alphas.std())}
