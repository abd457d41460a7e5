"""FedDyn: Federated Learning Based on Dynamic Regularization.
Acar, Zhao, Matas Navarro, Mattina, Whatmough, Saligrama. ICLR 2021. https://arxiv.org/abs/2111.04263
Official code: https://github.com/alpemreacar/FedDyn

Relative to FedAvg this changes both sides (Algorithm 1 of the paper). Client k, which received θ^{t-1},
minimises the dynamically regularised objective

    L_k(θ) - <∇L_k(θ_k^{t-1}), θ> + (α/2) ||θ - θ^{t-1}||²      (gradient: ∇L_k(θ) - ∇L_k(θ_k^{t-1}) + α (θ - θ^{t-1}))

with the same ``-ls`` epochs of SGD, then updates its state ∇L_k(θ_k^t) = ∇L_k(θ_k^{t-1}) - α (θ_k^t - θ^{t-1})
(zero before its first round; it never leaves the client). The server keeps h (zero at first) and sets

    h^t = h^{t-1} - α (1/m) Σ_{k∈P_t} (θ_k^t - θ^{t-1}),    θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t - h^t / α,

m = all N clients, P_t the clients whose upload arrived. The mean is unweighted, as in the paper; h and the
correction apply to parameters, and BatchNorm statistics (if any) get the plain unweighted mean. θ^t is the
model sent out and evaluated (traditional FL): it is what every client starts from. The official code
reports the accuracy of the plain mean (1/|P_t|) Σ θ_k^t instead (the model the paper's convergence
bound is stated for) and sends θ^t; evaluating the mean here would need a second model on every client
and a second download, so θ^t, which PFLlib evaluates too, is kept. The official code also clips every
local gradient at norm 10 (in all its methods, FedAvg included), which the paper does not; not done here. With ``-ala`` the local model starts from ALA's mix, and the
anchor θ^{t-1} in the regulariser and in the state updates stays the received global model.

Flags: ``-al`` α = 0.01 (the official example's value; the paper tunes α over {0.1, 0.01, 0.001}). PFLlib's
``-al`` defaults to 1.0 and its regulariser uses the non-squared norm (α/2) ||θ - θ^{t-1}||; here the
norm is squared, as in the paper, so that the state update above is the client's first-order condition.
The official code also divides α by each client's relative data size and adds weight decay; neither is
in the paper's algorithm, and neither is done here.

``-dp``: the regulariser's gradient is added after DP-SGD's clipped, noised gradient of the data loss
(``after_backward``), unclipped. It depends on the data only through earlier releases (θ_k^{t-1} and the
current iterate, themselves DP-SGD outputs), so adding it is post-processing and the accounting of the data
term stands; clipping it together with each sample's gradient would instead distort the paper's update.

Verified (tests/test_feddyn.py): local steps and the state update against an autograd reference on the
written-out objective, the server update by hand, resume from a checkpoint. Digits, 5 rounds, -lr 0.1:
0.96 (FedAvg 0.90) on an IID split of 5 clients, 0.69 (FedAvg 0.62) on a 6-client split with 2 classes each.
"""
from __future__ import annotations

import torch

from flcore.clients.clientdyn import FedDynClient
from flcore.servers.serverbase import Declares, Server
from utils.aggregate import weighted_average
from utils.errors import FLError


def dyn_server_step(global_params: dict, mean: dict, h: dict, deltas_sum: dict, alpha: float,
                    num_clients: int) -> tuple[dict, dict]:
    """FedDyn's server update on parameter dicts: h' = h - α Σ_k (θ_k - θ^{t-1}) / m and θ' = mean - h' / α,
    where ``deltas_sum`` = Σ_k (θ_k - θ^{t-1}) over the uploads and ``mean`` their unweighted mean.
    Returns (θ', h')."""
    new_h = {k: h[k] - alpha * deltas_sum[k] / num_clients for k in global_params}
    return {k: mean[k] - new_h[k] / alpha for k in global_params}, new_h


class FedDynServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Acar et al., ICLR 2021, [arXiv 2111.04263](https://arxiv.org/abs/2111.04263)",
        family=("traditional FL, dynamic regulariser −⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖² (squared, as the "
                "paper); client state ∇L_k updated after training; server state h, θ = mean − h/α"),
        flags="`-al` α 0.01 (official example; the paper's grid {0.1, 0.01, 0.001})",
        ala="yes: the local model; the regulariser's anchor stays the received global model")
    declares = Declares(
        client_class=FedDynClient,
        averaging_refusal="its server corrects the mean by its own state h",
        pfllib_defaults={"alpha": 1.0},
        personalized=False,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-al", "--alpha", type=float, default=0.01,
                            help="regulariser weight α (FedDyn paper grid {0.1, 0.01, 0.001}; official example "
                                 "0.01; PFLlib 1.0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if not cfg.alpha > 0:
            raise FLError(f"-al must be > 0 for FedDyn (got {cfg.alpha}): the server divides by α")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h = {k: torch.zeros_like(p) for k, p in self.global_model.named_parameters()}

    def aggregate(self, uploads) -> None:
        if not uploads:
            return
        mean = weighted_average([u.state for u in uploads], [1.0] * len(uploads))
        prev = {k: p.detach() for k, p in self.global_model.named_parameters()}
        deltas = {k: sum(u.state[k].detach() - prev[k] for u in uploads) for k in prev}
        params, self.h = dyn_server_step(prev, mean, self.h, deltas, self.cfg.alpha, len(self.clients))
        self.load_aggregate(self.global_model, {**mean, **params})
