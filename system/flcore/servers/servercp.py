"""FedCP: Separating Feature Information for Personalized Federated Learning via Conditional Policy.
Zhang, Hua, Wang, Song, Xue, Ma, Guan. KDD 2023. https://arxiv.org/abs/2307.01217
Official code: https://github.com/TsingZ0/FedCP

Relative to FedAvg this changes the model, the local objective and what is shared. Client i's model is a
feature extractor W^fe (``base``), a conditional policy network Θ (``cpn``: Linear(K, 2K) + LayerNorm +
ReLU), a global head W^hg (``head``) and a personal head W^hp_i (``phead``). For a sample's feature
h = f(x; W^fe) and the client's context v_i = Σ_rows W^hp_i (taken when the round starts), the CPN turns
h ⊙ v_i/||v_i|| into K pairs of scores; a Gumbel-softmax (temperature 1) over each pair gives the
sample's global and personal policies r, s with r + s = 1, so the feature is split exactly,
h = h ⊙ r + h ⊙ s, and

    ŷ = W^hg(h ⊙ r) + W^hp_i(h ⊙ s),
    L_i = CE(ŷ, y) + λ MMD²(h, ĥ),   ĥ = f(x; Ŵ^fe) from the received (frozen) extractor,

with MMD² under a sum of RBF kernels (widths 10, 15, 20, 50, the official code's). Each round the client
overwrites W^fe, Θ and W^hg with the global ones, trains W^fe, Θ and W^hp_i (W^hg frozen) and uploads
W^fe, Θ and W^hp_i; the server averages them, sample-weighted, into W^fe, Θ and the next global head:

    W^fe ← Σ_i (n_i / n) W^fe_i,   Θ ← Σ_i (n_i / n) Θ_i,   W^hg ← Σ_i (n_i / n) W^hp_i.

The personal head is thus uploaded but never overwritten: it stays the client's own. The context v_i is
the one model entry that never leaves the client (``personal_keys``). Evaluation uses the noise-free policy
(the softmax of the scores), so it is deterministic; the official code draws Gumbel noise at test time too.
The official code (and PFLlib) upload 0.5 W^hp_i + 0.5 W^hg in place of W^hp_i.

Flags: ``-lam`` λ = 5.0, the MMD weight (the official scripts' value; PFLlib's default is 1.0).
``-ala``: the received extractor, CPN and global head are initialised by ALA under the client's personal
head (the top ``-p`` tensors of extractor + CPN + global head: the global head's by default).
``-dp``: refused; the MMD term couples the samples of a batch, so per-sample gradients are undefined.
"""
from __future__ import annotations

from torch import nn

from flcore.clients.clientcp import CPModel, FedCPClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedCPServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhang et al., KDD 2023, [arXiv 2307.01217](https://arxiv.org/abs/2307.01217)",
        family=("pFL model splitting; a conditional policy network gives each sample's feature a global share "
                "(frozen global head) and a personal share (personal head); CE + λ MMD² to the received "
                "extractor; extractor, CPN and global head shared, the personal head uploaded and averaged into "
                "the global head but never overwritten; `-dp` refused"),
        flags="`-lam` λ 5.0",
        ala="yes")
    declares = Declares(
        client_class=FedCPClient,
        pfllib_defaults={"lamda": 1.0},
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal="its MMD term couples the samples of a batch, so per-sample gradients are undefined",
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-lam", "--lamda", type=float, default=5.0,
                            help="λ, weight of the MMD feature-alignment term (FedCP official scripts: 5)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.lamda < 0:
            raise FLError(f"FedCP needs -lam >= 0 (got {cfg.lamda})")

    def build_model(self):
        split = super().build_model()
        if not isinstance(split.head, nn.Linear):
            raise FLError(f"FedCP needs a linear classifier; -m {self.cfg.model} has {type(split.head).__name__}")
        return CPModel(split)
