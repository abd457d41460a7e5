"""GPFL: Simultaneously Learning Global and Personalized Feature Information for Personalized Federated
Learning. Zhang, Hua, Wang, Song, Xue, Ma, Cao, Guan. ICCV 2023. https://arxiv.org/abs/2308.10279
Official code: https://github.com/TsingZ0/GPFL

Relative to FedAvg this changes the model, the local objective and what is shared. Client i's model is a
feature extractor φ (``base``), a personal head W^h_i (``head``), a Conditional Valve V (``cov``) and the
Global Category Embeddings C (``gce``, one K-vector e_c per class). From the received embeddings the
client forms a global conditional input g = (1/|C|) Σ_c e_c and a personalized one p_i = Σ_c (n_i,c / n_i) e_c
(its label distribution); CoV maps a conditional input to (γ, β) and a feature f = φ(x) to
ReLU((γ + 1) ⊙ f + β), giving f^G = CoV(f; g) and f^P = CoV(f; p_i). The local objective is

    L_i = CE(W^h_i(f^P), y) + L^alg + λ L^mlg + (μ/2)(||V||² + ||C||²),
    L^alg = -log( e^{cos(f^G, e_y)} / Σ_u e^{cos(f^G, e_u)} ),     L^mlg = ||f^G - ê_y||_2,

(means over the batch) with ê the embeddings received this round, held fixed. The client uploads φ, V
and C; the server averages them, sample-weighted; W^h_i and p_i never leave the client
(``personal_keys``). Each client is evaluated on W^h_i(CoV(φ(x); p_i)).

The μ term is written as a loss term: its gradient is the official code's weight decay μ on V and C
(which also makes it part of each sample's clipped gradient under ``-dp``). L^mlg is the paper's per-sample
norm, averaged; the official code takes one norm over the whole batch. The conditional inputs come from
the received embeddings (the official code reads the client's embeddings before overwriting them, and
uses zero conditional inputs in round 0, before its first GCE arrives). Here round 0 already forms g and
p_i from the common initial GCE: the paper defines both from the GCE in every round, and zero inputs give
CoV a γ and β (LayerNorm of ReLU of the biases) that no later round uses.

Flags: ``-lam`` λ = 0.01 and ``-mu`` μ = 0.1, the official scripts' values for the 4-layer CNN and MLP
(their ResNet-18 / fastText runs use λ = 1e-4, μ = 0; PFLlib's defaults are -lam 1.0, -mu 0.0).
``-ala``: the received extractor, GCE and CoV are initialised by ALA under the client's head (the top
``-p`` tensors: CoV's last ones by default). ``-dp``: the whole objective is the DP-SGD objective; p_i
reads the client's label distribution, which is not privatised (``dp_support.uncovered``).
"""
from __future__ import annotations

from torch import nn

from flcore.clients.clientgpfl import GPFLClient, GPFLModel
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.dp_support import DPSupport
from utils.errors import FLError


class GPFLServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhang et al., ICCV 2023, [arXiv 2308.10279](https://arxiv.org/abs/2308.10279)",
        family=("pFL model splitting; shared extractor, Conditional Valve and Global Category Embeddings, "
                "personal head; CE + angle-level + λ magnitude-level guidance + μ/2 L2 on CoV and GCE"),
        flags="`-lam` λ 0.01, `-mu` μ 0.1",
        ala="yes")
    declares = Declares(
        client_class=GPFLClient,
        pfllib_defaults={"lamda": 1.0, "mu": 0.0},
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            uncovered=("GPFL's personalized conditional input, the category embeddings weighted by the client's label "
                       "distribution (a statistic of all its data)"),
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-lam", "--lamda", type=float, default=0.01,
                            help="λ, weight of the magnitude-level guidance (GPFL official scripts, CNN: 0.01)")
        parser.add_argument("-mu", "--mu", type=float, default=0.1,
                            help="μ, L2 weight on CoV and GCE (GPFL official scripts, CNN: 0.1)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.lamda < 0 or cfg.mu < 0:
            raise FLError(f"GPFL needs -lam >= 0 and -mu >= 0 (got {cfg.lamda}, {cfg.mu})")

    def build_model(self):
        split = super().build_model()
        if not isinstance(split.head, nn.Linear):
            raise FLError(f"GPFL needs a linear classifier; -m {self.cfg.model} has {type(split.head).__name__}")
        return GPFLModel(split)
