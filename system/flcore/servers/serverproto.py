"""FedProto: Federated Prototype Learning across Heterogeneous Clients.
Tan, Long, Liu, Zhou, Lu, Jiang, Zhang. AAAI 2022. https://arxiv.org/abs/2105.00243
Official code: https://github.com/yuetan031/FedProto

Relative to FedAvg no weight crosses the wire: clients exchange class prototypes, the mean
representation of each class under their own body f_i (the model is cut at its classifier,
``flcore.trainmodel.parts.split_head``). Each round client i trains its own model on

    L_i = CE(h_i(f_i(x)), y) + λ · mean (f_i(x) - P̄_y)²,

then uploads its prototypes C_i^(j) = mean over D_ij of f_i(x) with the counts |D_ij|; the server
averages them per class, weighted by the counts (the paper's Eq. 6, read as a weighted mean),

    P̄_j = Σ_{i ∈ N_j} |D_ij| C_i^(j) / Σ_{i ∈ N_j} |D_ij|,

and broadcasts {P̄_j}. A client is evaluated by the nearest global prototype (squared Euclidean
distance of f_i(x) to each P̄_j, as PFLlib), or by its local head before any prototype exists (round 0).
Only the feature dimension must agree between clients: nothing here assumes one model for all. With
``--client_models`` each client's model is its own architecture, the paper's heterogeneous setting (its
Section 4: clients whose models differ, sharing only the representation's dimension, here ``-fd``).

Flags: ``-lam`` λ = 1.0 (the official code's ``--ld`` default; PFLlib's too).

Refuses ``-ala`` (there is no global model to initialise from) and ``-dp`` (the uploaded prototypes
are means of the private training features, neither noised nor accounted).

Where PFLlib differs: its client averages the representations seen during training (of a model that
changes along the way, over every epoch); here, as Eq. 5, the prototypes are taken from the trained
body over the training data. Its server takes the unweighted mean over clients (so does the official
code), and forgets a class no participant of the round holds; here the mean is weighted by |D_ij|,
and such a class keeps its last global prototype (matters with ``-jr`` < 1 only).
"""
from __future__ import annotations

import torch

from flcore.clients.clientproto import FedProtoClient
from flcore.prototypes import aggregate_prototypes, refuse_ala
from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.parts import split_head
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport


class FedProtoServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Tan et al., AAAI 2022, [arXiv 2105.00243](https://arxiv.org/abs/2105.00243)",
        family=("pFL, prototypes only (count-weighted per class); CE + λ·MSE to the global prototype; nearest "
                "global prototype at evaluation (the local head before any exists); `-dp` refused"),
        flags="`-lam` λ 1.0",
        ala="refused: no global model")
    declares = Declares(
        client_class=FedProtoClient,
        averaging_refusal="its clients upload class prototypes, no model",
        pfllib_defaults={"lamda": 1.0},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="the server sends class prototypes, no model: a new client's encoder would be its random "
                              "initialisation",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("it uploads per-class means of the private training representations (prototypes), neither noised "
                     "nor accounted"),
        ),
        model_support=ModelSupport(  # --client_models: the paper's heterogeneous setting
            refusal="", shares="class prototypes (-fd wide) up, their weighted means down", same_shape="features"),
    )


    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-lam", "--lamda", type=float, default=1.0,
                            help="λ, weight of the pull toward the global prototypes (official code and PFLlib: 1.0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        refuse_ala(cfg, "FedProto")
        if cfg.lamda < 0:
            raise FLError(f"FedProto needs -lam >= 0 (got {cfg.lamda})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_protos: dict[int, torch.Tensor] = {}  # P̄_j by class

    def build_model(self, name=None):
        return split_head(super().build_model(name))

    def broadcast(self, client) -> dict:
        return self.global_protos

    def aggregate(self, uploads) -> None:
        if uploads:
            new = aggregate_prototypes([u.extras["protos"] for u in uploads], [u.extras["counts"] for u in uploads])
            self.global_protos = {**self.global_protos, **{c: p.to(self.device) for c, p in new.items()}}
