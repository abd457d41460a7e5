"""FedGC: Federated Learning for Face Recognition with Gradient Correction.
Niu, Deng. AAAI 2022. https://arxiv.org/abs/2112.07246

Relative to FedAvg this changes the classifier and adds a server step. The model is a body θ (``base``)
and bias-free class embeddings W (``head``, one row per class). Client k trains θ and the embeddings W_k
of its own classes C_k with a softmax over C_k only (logits of other classes are -inf), and uploads θ_k,
W_k and the indices C_k. Its softmax never sees other clients' classes, so nothing pushes their embeddings
away from its features: the server injects that missing cross-client gradient with a softmax-like
regulariser on the collected embeddings, one gradient step after averaging the bodies:

    θ ← Σ_k (n_k / Σ_j n_j) θ_k,      W ← W − λ η ∇_W Reg(W),
    Reg(W) = Σ_k Σ_{c ∈ C_k} −log( e^{a·a} / (e^{a·a} + Σ_{j: c ∉ C_j} Σ_{u ∈ C_j} e^{a·W_{j,u}}) ),  a = sg[W_{k,c}],

where sg is stop-gradient (the anchor stands in for class c's features, which are not the server's to
move; PFLlib stops it too), η is ``-lr`` and λ is ``-lam``. The anchor of client k's term for class c is
client k's own embedding W_{k,c}, the paper's term; PFLlib anchors every holder's term for c at the mean
of the holders' embeddings of c. With disjoint label sets (the paper's setting) the two coincide; with
overlapping ones the mean would pull every holder's negatives by one shared anchor, and the paper's
per-client term is kept. In the paper's face-recognition setting every
class (identity) belongs to one client; here label sets overlap, so each client keeps its own embeddings
(stored on the server, corrected, and sent back to it each round, as in PFLlib) and the negatives of
client k's class c are the embeddings of the clients that do not hold c (those that do already separate
c from their other classes in their own softmax). Each client is evaluated on its body and its own
embeddings, predicting among its own classes. Clients the server has not heard from yet keep their
initial embeddings. The softmax is computed with log-sum-exp (PFLlib exponentiates directly, which
overflows for large embeddings).

Flags: ``-lam`` λ = 1.0, the weight of the regulariser (the server step is λ·``-lr``, as in PFLlib).
``-ala``: the body is initialised by ALA from the global body, under the client's own embeddings.
``-dp``: refused; each client trains and uploads the embeddings of exactly the classes in its data, so
every upload reveals its label set, which DP-SGD does not privatise.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientgc import FedGCClient, GCModel
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.dp_support import DPSupport
from utils.errors import FLError


def gc_regulariser(embeddings: list[torch.Tensor], classes: list[torch.Tensor]) -> torch.Tensor:
    """Reg(W) of the module docstring. ``embeddings[k]``: client k's class embeddings (|C_k| x K) in the
    order of ``classes[k]`` (its class indices). The anchors are detached; only negatives get gradient."""
    emb = torch.cat(embeddings)
    label = torch.cat(classes)
    owner = torch.cat([torch.full((len(c),), k, device=emb.device) for k, c in enumerate(classes)])
    n_classes = int(label.max()) + 1
    holds = torch.zeros(len(classes), n_classes, dtype=torch.bool, device=emb.device)
    holds[owner, label] = True
    negative = ~holds[owner][:, label].T  # [m, n]: row n's client does not hold anchor m's class
    anchor = emb.detach()
    own = (anchor * anchor).sum(1)
    scores = (anchor @ emb.T).masked_fill(~negative, float("-inf"))
    return (torch.logsumexp(torch.cat([own[:, None], scores], 1), 1) - own).sum()


def corrected(embeddings: list[torch.Tensor], classes: list[torch.Tensor], step: float) -> list[torch.Tensor]:
    """W − step · ∇_W Reg(W): one gradient step of the regulariser, per client."""
    leaves = [e.detach().clone().requires_grad_(True) for e in embeddings]
    grads = torch.autograd.grad(gc_regulariser(leaves, classes), leaves, allow_unused=True)
    return [e.detach() - step * (g if g is not None else 0) for e, g in zip(leaves, grads)]


class FedGCServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Niu & Deng, AAAI 2022, [arXiv 2112.07246](https://arxiv.org/abs/2112.07246)",
        family=("pFL model splitting; clients train the body and their own classes' embeddings (softmax over "
                "their own classes); the server averages bodies and takes a λ·lr step on a softmax regulariser "
                "whose negatives are the other clients' embeddings of classes they do not hold; `-dp` refused"),
        flags="`-lam` λ 1.0",
        ala="yes: the body")
    declares = Declares(
        client_class=FedGCClient,
        pfllib_defaults={"lamda": 1.0},
        # --aggregator: the embeddings regulariser reads every client's uploaded class embeddings, outside the rule
        robust_refusal="its server's embeddings regulariser reads every uploaded class embedding, outside the rule",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("each client uploads the class embeddings of exactly the labels in its data, which reveals its "
                     "label set"),
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-lam", "--lamda", type=float, default=1.0,
                            help="λ, weight of the gradient-correction regulariser (server step λ·lr)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.lamda < 0:
            raise FLError(f"FedGC needs -lam >= 0 (got {cfg.lamda})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.embeddings: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (classes, W_k)

    def build_model(self):
        split = super().build_model()
        if not isinstance(split.head, nn.Linear):
            raise FLError(f"FedGC needs a linear classifier; -m {self.cfg.model} has {type(split.head).__name__}")
        return GCModel(split)

    def broadcast(self, client):
        own = self.embeddings.get(client.id)
        return self.shared_part, (own[1] if own is not None else None)

    def aggregate(self, uploads) -> None:
        """Average the bodies, keep the uploaded embeddings, then one corrected step on all of them."""
        super().aggregate(uploads)
        for u in uploads:
            self.embeddings[u.id] = (u.extras["classes"].to(self.device), u.extras["embeddings"].to(self.device))
        if not uploads or self.cfg.lamda == 0:
            return
        ids = sorted(self.embeddings)
        lr = self.cfg.local_learning_rate
        if self.cfg.learning_rate_decay:
            lr *= self.cfg.learning_rate_decay_gamma ** self.round_idx
        new = corrected([self.embeddings[i][1] for i in ids], [self.embeddings[i][0] for i in ids],
                        self.cfg.lamda * lr)
        for i, w in zip(ids, new):
            self.embeddings[i] = (self.embeddings[i][0], w)
