"""FedPCL: Federated Learning from Pre-Trained Models: A Contrastive Learning Approach.
Tan, Long, Ma, Liu, Zhou, Jiang. NeurIPS 2022. https://arxiv.org/abs/2209.10083
Official code: https://github.com/yuetan031/FedPCL

As in PFLlib, without the frozen pre-trained backbones: each client trains its whole model, cut below
its classifier (the head is the identity: the model's output is its body's representation). Relative
to FedAvg no weight crosses the wire. Client i uploads its local prototypes c_i^k (the mean L2-normalised
representation z = f_i(x)/||f_i(x)|| of class k, with the counts |D_ik|); the server forms the global
prototypes c̄^k = Σ_i |D_ik| c_i^k / Σ_i |D_ik| and sends them with every client's local set (a class a
client lacks is padded with c̄^k). Local training minimises the prototype-wise contrastive losses

    L = L_g + L_p,   L_g = -log( exp(z·c̄^y / τ) / Σ_k exp(z·c̄^k / τ) ),
                     L_p = (1/m) Σ_{j=1..m} -log( exp(z·c_j^y / τ) / Σ_k exp(z·c_j^k / τ) ),

over the m clients that have uploaded prototypes. The first round only collects prototypes (there is
nothing to contrast with yet). A client is evaluated by its nearest own prototype (squared Euclidean
distance of z, as the official code's evaluation).

With ``--client_models`` every client's encoder is its own architecture: prototypes of one dimension
(``-fd``) are all that is shared.

Flags: ``-tau`` τ = 0.07 (the official code's contrastive temperature; PFLlib's default is 1.0).

Refuses ``-ala`` (there is no global model to initialise from), ``-dp`` (the uploaded prototypes
are means of the private training features, neither noised nor accounted) and ``-dlg`` (the model outputs
representations, not class scores: there is no cross-entropy gradient for DLG to match).

Where PFLlib differs: it stacks prototype dicts in key order, so a table whose classes are not 0..C-1
in order is matched to the wrong labels; it averages the global prototypes without weights, clips the
gradient norm at 10 (not in the paper), divides L_p by the number of all clients (padding those that
never uploaded with the global prototypes), and classifies by the largest dot product with the local
prototypes.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientpcl import FedPCLClient
from flcore.prototypes import aggregate_prototypes, refuse_ala
from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.parts import split_head
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport


class FedPCLServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Tan et al., NeurIPS 2022, [arXiv 2209.10083](https://arxiv.org/abs/2209.10083)",
        family=("pFL, representation trained by prototype-wise contrastive losses (global + each client's local "
                "prototypes), without pre-trained backbones; nearest own prototype at evaluation; `-dp` refused"),
        flags="`-tau` τ 0.07",
        ala="refused: no global model")
    declares = Declares(
        client_class=FedPCLClient,
        averaging_refusal="its clients upload class prototypes, no model",
        pfllib_defaults={"tau": 1.0},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="the server sends prototypes, no model: a new client's encoder would be its random "
                              "initialisation",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("it uploads per-class means of the private training representations (prototypes), neither noised "
                     "nor accounted"),
        ),
        model_support=ModelSupport(  # --client_models: every client's encoder is its own architecture
            refusal="", shares="class prototypes (-fd wide) up, the global and every client's prototypes down",
            same_shape="features"),
    )


    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-tau", "--tau", type=float, default=0.07,
                            help="τ, contrastive temperature (official code: 0.07; PFLlib: 1.0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        refuse_ala(cfg, "FedPCL")
        if cfg.dlg_eval:
            raise FLError("-dlg: FedPCL is refused: its model outputs -fd-wide representations, not class scores, "
                          "so there is no cross-entropy gradient for DLG to match; drop -dlg")
        if cfg.tau <= 0:
            raise FLError(f"FedPCL needs -tau > 0 (got {cfg.tau})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_protos: dict[int, torch.Tensor] = {}  # c̄^k by class
        self.client_protos: dict[int, dict] = {}  # each client's last uploaded c_i^k

    def build_model(self, name=None):
        """The representation network: the model's body, its classifier replaced by the identity."""
        model = split_head(super().build_model(name))
        model.head = nn.Identity()
        return model

    def broadcast(self, client) -> dict:
        return {"global": self.global_protos, "locals": self.client_protos}

    def aggregate(self, uploads) -> None:
        if not uploads:
            return
        new = aggregate_prototypes([u.extras["protos"] for u in uploads], [u.extras["counts"] for u in uploads])
        self.global_protos = {**self.global_protos, **{c: p.to(self.device) for c, p in new.items()}}
        self.client_protos = {**self.client_protos,
                              **{u.id: {c: p.to(self.device) for c, p in u.extras["protos"].items()} for u in uploads}}
