"""MOON: Model-Contrastive Federated Learning.
Li, He, Song. CVPR 2021. https://arxiv.org/abs/2103.16257
Official code: https://github.com/QinbinLi/MOON

Relative to FedAvg this changes only the client's local objective. With z = R_w(x) the representation of
x under the local model (here the input of the classifier ``fc``: the model is cut by
``flcore.trainmodel.parts.split_head``), z_glob = R_{w^t}(x) under the global model received this round
and z_prev = R_{w_i^{t-1}}(x) under the client's own model after its last local training,

    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) ),
    l     = CE(fc(z), y) + mu * l_con,          sim = cosine similarity,

averaged over the batch (the paper's local objective). The global and previous models are frozen copies (no
gradient, evaluation mode). Before a client has trained there is no previous model and l_con = 0: the
official code's softmax then holds the positive pair alone (PFLlib starts from a copy of the initial
model instead, which gives the constant log 2, also without gradient). Upload and aggregation are
FedAvg's; ``-mu 0`` is FedAvg number for number.

The paper's networks add a projection head between the encoder and the output layer and contrast its
output; like PFLlib, this port contrasts the classifier's input of the library's models (no extra layers).

Flags: ``-mu`` mu = 5 (the paper's value for CIFAR-10; 1 for CIFAR-100 and Tiny-ImageNet; PFLlib's default
is 0, which silently runs FedAvg); ``-tau`` tau = 0.5 (the paper; PFLlib's default is 1.0).
``-ala``: the local model is initialised by ALA; z_glob still comes from the received global model.
``-dp``: the contrastive term is part of the per-sample objective (the frozen models are constants of the
per-sample gradient), so DP-SGD covers every step.

Verified (tests/test_moon.py): l_con by hand, the local objective and its gradient against an independent
formula, ``-mu 0`` = FedAvg bit for bit. Scale: 5 rounds of the 5-client IID Digits split at -lr 0.1 reach
0.84 (FedAvg 0.90); the paper's CIFAR results are not reproduced here.
"""
from flcore.clients.clientmoon import MOONClient
from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.parts import split_head
from utils.errors import FLError


class MOONServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Li, He, Song, CVPR 2021, [arXiv 2103.16257](https://arxiv.org/abs/2103.16257)",
        family=("traditional FL, CE + μ·model-contrastive loss on the classifier's input (positive: the global "
                "model's, negative: the client's previous model's; none before its first training); no projection "
                "head, as PFLlib"),
        flags="`-mu` μ 5, `-tau` τ 0.5",
        ala="yes: the local model; the positive stays the received global model")
    declares = Declares(
        client_class=MOONClient,
        pfllib_defaults={"mu": 0.0, "tau": 1.0},
        personalized=False,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-mu", "--mu", type=float, default=5.0,
                            help="weight mu of the model-contrastive loss (MOON paper: 5 on CIFAR-10, 1 on "
                                 "CIFAR-100; 0 = FedAvg)")
        parser.add_argument("-tau", "--tau", type=float, default=0.5,
                            help="temperature tau of the contrastive loss (MOON paper: 0.5)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.mu < 0 or cfg.tau <= 0:
            raise FLError(f"MOON needs -mu >= 0 and -tau > 0 (got -mu {cfg.mu}, -tau {cfg.tau})")

    def build_model(self):
        return split_head(super().build_model())
