"""FD (Federated Distillation): Communication-Efficient On-Device Machine Learning: Federated Distillation
and Augmentation under Non-IID Private Data.
Jeong, Oh, Kim, Park, Bennis, Kim. NeurIPS 2018 workshop (MLPCD). https://arxiv.org/abs/1811.11479

Relative to FedAvg no model crosses the wire: every client keeps its own model w_i (the one evaluated) and
exchanges per-label mean logit vectors (C x C numbers at most). During its local steps client i adds a
distillation term toward the other clients' mean logits of each sample's label and accumulates its own:

    loss(x, y) = CE(F(w_i, x), y) + λ H(softmax(F̂^{(i)}_y), softmax(F(w_i, x))),
    F̄^{(i)}_l = mean of F(w_i, x) over the round's training samples x of label l (logits before softmax),
    F̂^{(i)}_l = mean over the clients j ≠ i that uploaded label l of F̄^{(j)}_l   (the server's step),

H the soft-target cross-entropy (the paper's cross-entropy regulariser φ), a sample whose label no other
client uploaded adding no term. The paper excludes the device's own logits from its global average
(Algorithm 1: F̂^{(i)} = (Σ_j F̄^{(j)} - F̄^{(i)}) / (M - 1)); here the average runs over the clients that
uploaded that label, which is the paper's when every client holds every label. The global logits come from
the last round's uploads (the paper has every device take part each round; with -jr < 1 the round's
participants). Before the first aggregation the clients train on CE alone. FAug (the paper's GAN-based
augmentation) is not part of FD and is not implemented.

Only logits cross the wire, so with ``--client_models`` every client's model is its own architecture.

Flags: ``-lam`` λ = 1 (PFLlib's default; the paper gives no value). ``-ala`` is refused: there is no
global model to initialise from. ``-dp`` is refused: the uploaded per-label mean logits are computed from
the private data with no noise.

Where PFLlib differs: it averages every client's logits including the receiver's own, uses the raw mean
logits as the "probabilities" of its cross-entropy target (they are neither positive nor normalised) and,
for a sample whose label has no global logits, distils toward the sample's own output.

Verified (tests/test_fd.py): the per-label means, the server's average without the receiver's own, the
distillation term by hand, no weights on the wire, λ = 0 equals Local. Digits (sklearn's), 5 rounds at
-lr 0.1, one seed: 5 IID clients 0.836 (FedAvg 0.896, Local 0.802), 6 clients with 2 classes each 1.000
(FedAvg 0.621); uploads 2.4 KB a round for 5 clients (FedAvg 3.8 MB).
"""
from __future__ import annotations

import torch

from flcore.clients.clientfd import FDClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport


class FDServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Jeong et al., NeurIPS 2018 workshop, [arXiv 1811.11479](https://arxiv.org/abs/1811.11479)",
        family=("pFL KD: clients upload per-label mean logits of the round; each gets the other clients' "
                "per-label mean (its own excluded) and adds λ·soft-target CE toward it; no weights on the wire; "
                "`-dp` refused"),
        flags="`-lam` λ 1",
        ala="refused: no global model")
    declares = Declares(
        client_class=FDClient,
        averaging_refusal="its clients upload per-label logits, no model",
        pfllib_defaults={"lamda": 1.0},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="the server sends per-label logits, no model: a new client's model would be its random "
                              "initialisation",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal="it uploads per-label mean logits computed from the private data, with no noise",
        ),
        model_support=ModelSupport(  # --client_models: every client's model is its own architecture
            refusal="", shares="per-label mean logits, up and down (C x C numbers at most)", same_shape="logits"),
    )


    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-lam", "--lamda", type=float, default=1.0,
                            help="λ, weight of the distillation term (PFLlib: 1; the paper gives none)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.ala:
            raise FLError("-ala initialises a local model from the global model; FD has no global model "
                          "(clients exchange logits only), so drop -ala")
        if cfg.lamda < 0:
            raise FLError(f"FD needs -lam >= 0 (got {cfg.lamda})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.uploaded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (labels, mean logits)

    def aggregate(self, uploads) -> None:
        if not uploads:  # nobody uploaded: the last global logits stay
            return
        self.uploaded = {u.id: (u.extras["labels"], u.extras["logits"]) for u in uploads}

    def broadcast(self, client):
        """Client i's F̂^{(i)}: for each label, the mean of the other uploaders' mean logits (None before
        any upload; a label no one else uploaded is left out, so the client drops its old target for it)."""
        if not self.uploaded:
            return None
        c = self.data.num_classes
        total = torch.zeros(c, c, device=self.device)
        count = torch.zeros(c, device=self.device)
        for cid in sorted(self.uploaded):  # one summation order, whatever order the uploads came in
            labels, logits = self.uploaded[cid]
            if cid != client.id:
                total[labels] += logits.to(total)
                count[labels] += 1
        labels = count.nonzero().flatten()
        return {"labels": labels, "logits": total[labels] / count[labels, None]}
