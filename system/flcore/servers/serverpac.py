"""FedPAC: Personalized Federated Learning with Feature Alignment and Classifier Collaboration.
Xu, Tong, Huang. ICLR 2023. https://arxiv.org/abs/2306.11867
Official code: https://github.com/JianXu95/FedPAC

Relative to FedAvg this changes local training, what is shared and how heads are formed. The model is
cut into a body f (``base``) and a head g_i (``head``, ``flcore.trainmodel.parts.split_head``). Client i
first computes, with the body it received, its feature statistics (v_i, H_i) (clients/clientpac.py
``feature_statistics``), trains its head for ``-pls`` epochs on the frozen body, then the body for
``-ls`` epochs on

    L_i = CE(g_i(f(x)), y) + λ · mean (f(x) - c_y)²      (feature alignment to the global centroids),

and uploads body, head, its class centroids ĉ_ik with counts n_ik, and (v_i, H_i). The server averages
the bodies by samples (FedAvg), the centroids per class by count (c_k = Σ_i n_ik ĉ_ik / Σ_i n_ik), and
gives each participant i the head Σ_j α_ij g_j, where α_i solves the quadratic program

    min_α  α^T (diag(v) + D_i) α   s.t. α >= 0, Σ_j α_j = 1,   D_i[j, j'] = Σ_k (H_i[k] - H_j[k])·(H_i[k] - H_j'[k]),

over the round's uploads (the paper's classifier collaboration; v and H as the official code computes
them). The program is solved exactly: diag(v) + D_i = G^T G with G = [diag(√v); columns vec(H_i - H_j)],
and with β >= 0 minimising ||G β||² + (Σ β - 1)², α = β / Σ β minimises ||G α||² on the simplex
(for β = s α the objective is s² q + (s - 1)², whose minimum over s, q / (1 + q), increases with
q = ||G α||²). The non-negative least squares problem is scipy's (Lawson-Hanson active set, finite).
The combined head reaches client i with the next broadcast, with the global body and centroids.

Flags: ``-lam`` λ = 1.0 (paper and official code; PFLlib's too); ``-pls`` head epochs = 1 (the official
code's ``epoch_classifier``; PFLlib's is 1 too), ``-ls`` body epochs. Both phases use the client's optimizer
at -lr (plain SGD, as for every algorithm here and in PFLlib). The official code trains the head at a
fixed rate 0.1 and both phases with momentum 0.5 and weight decay 5e-4, the optimizer of all its methods
(FedAvg included), so its comparisons share it; here FedPAC shares the library's.

A sample whose class has no global centroid yet (no participant holding it has uploaded: the server keeps
every centroid once received, so only before then) adds no pull, as in PFLlib; the official code pulls it
toward the client's own centroid of the received body instead, a term that only holds the features
where they are.

``-ala`` initialises the body from the global body (ALA on the top ``-p`` tensors of the body, under the
client's new head). Refuses ``-dp``: the centroids and statistics it uploads are means of the private
features, neither noised nor accounted.

Where PFLlib differs: it combines the clients' live heads one client after the other, so a later
client's combination already sees the heads given to earlier ones; where the program has no solution
it falls back to the head at position "client id" of the uploads (a wrong head whenever ids and
positions differ); it averages the centroids without weights (the official code weights them by count),
and solves the program with cvxpy after clipping small eigenvalues, thresholding the answer at 1e-3 (so
does the official code); here the exact solution is used as is. Its head epochs are fixed at 1 (``-pls``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from flcore.clients.clientpac import FedPACClient
from flcore.prototypes import aggregate_prototypes
from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.parts import split_head
from utils.aggregate import weighted_average
from utils.dp_support import DPSupport
from utils.errors import FLError


def combination_weights(v: torch.Tensor, hs: torch.Tensor, i: int) -> np.ndarray:
    """α_i for client ``i`` of the clients with variances ``v`` (m,) and H statistics ``hs`` (m, C, d):
    the minimiser of α^T (diag(v) + D_i) α on the probability simplex (see the module docstring)."""
    from scipy.optimize import nnls

    m = len(v)
    diffs = (hs[i].unsqueeze(0) - hs).reshape(m, -1).double()  # row j: vec(H_i - H_j)
    g = torch.cat([torch.diag(v.double().clamp(min=0).sqrt()), diffs.T]).numpy()
    scale = np.sqrt((g ** 2).sum(0).max())  # columns of G at most unit length: well-conditioned NNLS
    if scale > 0:
        g = g / scale
    a = np.vstack([g, np.ones((1, m))])
    b = np.zeros(a.shape[0])
    b[-1] = 1.0
    beta, _ = nnls(a, b, maxiter=50 * m)
    return beta / beta.sum()


class FedPACServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Xu et al., ICLR 2023, [arXiv 2306.11867](https://arxiv.org/abs/2306.11867)",
        family=("pFL, shared body + feature alignment to global centroids; heads combined per client by an "
                "exactly solved QP (scipy NNLS on the factored problem); `-dp` refused"),
        flags="`-lam` λ 1.0, `-pls` 1 head epoch",
        ala="yes: the body, under the client's new head")
    declares = Declares(
        client_class=FedPACClient,
        pfllib_defaults={"lamda": 1.0, "plocal_epochs": 1},
        # --aggregator: the heads each client gets are mixed from the uploaded heads, and the global prototypes
        # from the uploaded centroids, outside the rule (tests/test_no_bypass.py)
        robust_refusal="each client's head is combined from the uploaded heads, and the global prototypes from the "
                          "uploaded centroids, outside the rule",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("it uploads class centroids and feature statistics (means of the private training "
                     "representations), neither noised nor accounted"),
        ),
        checkpoint_skip=("body",),  # a view of the global model, rebuilt every broadcast
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-lam", "--lamda", type=float, default=1.0,
                            help="λ, weight of the feature alignment (paper and official code: 1.0)")
        parser.add_argument("-pls", "--plocal_epochs", type=int, default=1,
                            help="head epochs per round, body frozen (official code: 1)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.lamda < 0 or cfg.plocal_epochs < 0:
            raise FLError(f"FedPAC needs -lam >= 0 and -pls >= 0 (got {cfg.lamda}, {cfg.plocal_epochs})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_protos: dict[int, torch.Tensor] = {}  # c_k by class
        self.heads: dict[int, dict] = {}  # the last aggregation's combined heads, by client id
        self.weights: dict[int, np.ndarray] = {}  # and their α_i (over that round's uploads, by position)
        self.body: nn.ModuleDict | None = None  # what is broadcast of the global model: its body

    def build_model(self):
        return split_head(super().build_model())


    def prepare_broadcast(self, participants) -> None:
        self.body = nn.ModuleDict({"base": self.global_model.base})

    def broadcast(self, client) -> dict:
        return {"model": self.body, "protos": self.global_protos, "head": self.heads.get(client.id)}

    def aggregate(self, uploads) -> None:
        if not uploads:
            return
        states = [u.state for u in uploads]
        self.average_uploads(uploads, self.global_model.base, prefix="base.")
        new = aggregate_prototypes([u.extras["protos"] for u in uploads], [u.extras["counts"] for u in uploads])
        self.global_protos = {**self.global_protos, **{c: p.to(self.device) for c, p in new.items()}}
        v = torch.stack([u.extras["v"].cpu() for u in uploads])
        hs = torch.stack([u.extras["H"].cpu() for u in uploads])
        head = [k for k in states[0] if k.startswith("head.")]
        self.heads, self.weights = {}, {}
        for i, u in enumerate(uploads):
            self.weights[u.id] = combination_weights(v, hs, i)
            combined = weighted_average(states, self.weights[u.id].tolist(), keys=head)
            self.heads[u.id] = {k[len("head."):]: t for k, t in combined.items()}
