"""FedNTD: Preservation of the Global Knowledge by Not-True Distillation in Federated Learning.
Lee, Jeong, Shin, Bae, Yun. NeurIPS 2022. https://arxiv.org/abs/2106.03097
Official code: https://github.com/Lee-Gihun/FedNTD

Relative to FedAvg this changes only the client's loss: local training distils the received global model's
knowledge of the classes that are *not* the sample's label. With q̃^τ the softmax at temperature τ over the
logits of the not-true classes only (the true class y removed before the softmax, C - 1 entries),

    loss = CE(z, y) + β τ² KL(q̃^τ(z_g) || q̃^τ(z)),

z the local model's logits, z_g those of the global model received this round (a frozen copy, in eval
mode, so a model with dropout or BatchNorm gives a deterministic teacher; the official code leaves it in
train mode), KL averaged over the batch. Aggregation is FedAvg's and the global model is the one evaluated
(traditional FL); ``-bt 0`` is FedAvg number for number. With ``-ala`` the local model is initialised by
ALA and the teacher stays the received global model.

Flags: ``-bt`` β = 1.0 and ``-tau`` τ = 1.0 (the paper's and the official configuration's). PFLlib's ``-bt``
defaults to 0.0, which silently runs FedAvg. The KL term is multiplied by τ², as in the official criterion
(it keeps the distillation gradient's scale as τ grows; no change at the default τ = 1).

``-dp`` works: the teacher's logits depend on the sample itself and on the global model only (other clients'
releases), so the whole loss goes through DP-SGD's per-sample clipping (the teacher is a client module that
is not trained).

Verified (tests/test_fedntd.py): the not-true logits and the loss against hand computations, ``-bt 0``
against FedAvg's numbers, DP-SGD without noise or clipping against plain autograd. Digits, 5 rounds,
-lr 0.1: 0.90 (FedAvg 0.90) on an IID split of 5 clients, 0.61 (FedAvg 0.62) on a 6-client split with 2
classes each.
"""
from __future__ import annotations

from flcore.clients.clientntd import FedNTDClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


class FedNTDServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Lee et al., NeurIPS 2022, [arXiv 2106.03097](https://arxiv.org/abs/2106.03097)",
        family=("traditional FL, CE + β τ² KL(q̃_global ‖ q̃_local) over the not-true classes, from a frozen copy "
                "of the received global model"),
        flags="`-bt` β 1, `-tau` τ 1",
        ala="yes: the local model; the teacher stays the received global model")
    declares = Declares(
        client_class=FedNTDClient,
        pfllib_defaults={"beta": 0.0, "tau": 1.0},
        personalized=False,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-bt", "--beta", type=float, default=1.0,
                            help="weight β of the not-true distillation term (FedNTD paper: 1; PFLlib 0 = FedAvg)")
        parser.add_argument("-tau", "--tau", type=float, default=1.0,
                            help="softmax temperature τ of the not-true distributions (FedNTD paper: 1)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if not (cfg.beta >= 0 and cfg.tau > 0):
            raise FLError(f"FedNTD needs -bt >= 0 and -tau > 0 (got -bt {cfg.beta}, -tau {cfg.tau})")
