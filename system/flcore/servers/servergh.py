"""FedGH: Heterogeneous Federated Learning with Generalized Global Header.
Yi, Wang, Liu, Shi, Yu. ACM Multimedia 2023. https://arxiv.org/abs/2303.13137

Relative to FedAvg this changes what crosses the wire and where the shared part is trained. Each client's
model is its own feature extractor φ_k (``base``, which may differ between clients: the server never reads
one) under a prediction header θ (``head``, the classifier; ``flcore.trainmodel.parts.split_head``) that
all clients share. Each round client k replaces its header by the global θ, trains body and header
together for ``-ls`` epochs, and uploads, for every class s it holds, the mean representation of its
samples of that class (its "local averaged representations"):

    (φ_k, θ_k) ← SGD^{ls}((φ_k, θ); D_k),   R_k^s = (1 / |D_k^s|) Σ_{x ∈ D_k^s} φ_k(x).

The server trains the header on those (representation, label) pairs, one SGD step per pair, clients by
id and classes ascending, and broadcasts only the header:

    θ ← θ - η_θ ∇_θ CE(θ(R_k^s), s)   for each uploading k, each class s of k.

With ``--client_models`` the extractors φ_k are the clients' own architectures, the paper's setting
(heterogeneous extractors, one header over representations of one dimension, here ``-fd``).

No body and no trained header leave a client (``personal_keys = ("",)``); each client is evaluated on its
own body under the header it received. With ``-ala`` the received header is initialised by ALA under the
client's own body (the header is one layer: ``-p`` 1 or 2, the default). ``-dp`` is refused: the
uploaded class means are computed from the client's data outside DP-SGD.

Flags: ``-slr`` η_θ = 1.0 (PFLlib's name and default). One step per pair at η_θ = 1 moves the header by
about ||R||² per pair: with large representations (``-m BNCNN`` on the tiny Digits split: train loss 355
after 2 rounds, 1.8 at ``-slr 0.1``) lower ``-slr``.

Where PFLlib differs: its server trains the header on the pairs in shuffled batches of ``-lbs`` (one
mean step per batch) instead of one step per pair, and its server header is the same object as client
0's header, so client 0's local training also moves the global header (here the server holds its own).

Verified (tests/test_fedgh.py): the uploaded class means equal per-class means of the trained body taken
by hand, the header steps equal hand-written softmax-regression steps, no model entry is uploaded and only
the header goes down. Digits (sklearn's), 5 rounds, -lr 0.1, batch 10, one seed: 0.83 on 5 IID clients
(FedAvg 0.90), 0.996 on 6 clients with 2 classes each (FedAvg 0.62).
"""
import torch
from torch import nn

from flcore.clients.clientgh import FedGHClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.dp_support import DPSupport
from utils.model_support import ModelSupport


def train_header(head: nn.Module, reps: torch.Tensor, labels: torch.Tensor, lr: float) -> None:
    """One SGD step of rate ``lr`` on CE(head(r), y) for each pair (r, y) of ``reps`` (k x d) and
    ``labels`` (k), in order, in place."""
    params = [p for p in head.parameters() if p.requires_grad]
    for r, y in zip(reps, labels):
        loss = nn.functional.cross_entropy(head(r[None]), y[None])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= lr * g


class FedGHServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Yi et al., ACM MM 2023, [arXiv 2303.13137](https://arxiv.org/abs/2303.13137)",
        family=("pFL, local bodies + a global header trained on the server from per-class mean features (no model "
                "entry uploaded); `-dp` refused"),
        flags="`-slr` 1.0",
        ala="yes: the header, adapted under the local body")
    declares = Declares(
        client_class=FedGHClient,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("it uploads per-class mean representations of client data, not model steps or updates that -dp "
                     "privatises"),
        ),
        slr_default=1.0,  # -slr: η_θ, the server's SGD rate on the global header (PFLlib: 1)
        averaging_refusal="its server trains a header on uploaded class means; no model is averaged",
        model_support=ModelSupport(  # --client_models: the paper's heterogeneous feature extractors
            refusal="", shares="class-mean representations (-fd wide) up, the global header down", same_shape="head"),
    )

    def aggregate(self, uploads) -> None:
        """The header's SGD steps on every uploaded (class mean, label) pair."""
        head = self.global_model.head
        head.train()
        for u in sorted(uploads, key=lambda u: u.id):
            train_header(head, u.extras["reps"].to(self.device), u.extras["labels"].to(self.device),
                         self.cfg.server_learning_rate)
