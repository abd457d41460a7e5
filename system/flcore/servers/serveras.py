"""FedAS: Bridging Inconsistency in Personalized Federated Learning.
Yang, Huang, Ye. CVPR 2024. https://openaccess.thecvf.com/content/CVPR2024/html/Yang_FedAS_Bridging_Inconsistency_in_Personalized_Federated_Learning_CVPR_2024_paper.html
Official code: https://github.com/xiyuanyang45/FedAS

Relative to FedAvg this changes what is shared (a global body φ, ``base``; each client keeps its own
head h_i, ``head``: ``flcore.trainmodel.parts.split_head``), how a client takes the global body, and the
aggregation weights. Parameter alignment: a participant i first computes its class prototypes with its
own (previous) body φ_i, z_c = mean_{x ∈ D_i^c} φ_i(x), then trains the received body so that its
representations move to them, and only then takes it:

    φ̃ ← SGD^{ae}(φ; Σ_c mean_{x ∈ D_i^c} ||φ(x) - z_c||² / d),   φ_i ← φ̃.

It trains body and head together for ``-ls`` epochs (as FedAvg). Client synchronization: the body it
uploads is weighted by the trace of the Fisher information of its trained model, estimated in one more
pass over its training data in shuffled batches b of ``-lbs`` (from each batch's mean score, as in the
official code), so that under-trained knowledge weighs little:

    F_i = Σ_b ||∇_{(φ_i, h_i)} (1/|b|) Σ_{(x, y) ∈ b} log p(y | x)||²,   φ ← Σ_i (F_i / Σ_j F_j) φ_i.

Only participants receive the body (the others keep their model, as in the official code); heads never
leave the clients (``personal_keys = ("head.",)``). With ``-ala`` the aligned body is taken by ALA under
the client's own head (its top ``-p`` tensors of the body). ``-dp`` is refused: the alignment (its
prototypes and its steps) and the Fisher trace sent as aggregation weight are computed from the
client's data outside DP-SGD.

Flags (the official code's fixed values, not flags there or in PFLlib): ``--align_lr`` 0.01,
``--align_epochs`` ae = 1, ``--align_batch_size`` 16.

Where PFLlib (and the official code) differ: every client, selected or not, runs the Fisher pass each
round, though only the participants' traces are used (here only participants run it); the server
averages whole models, heads included, which no client reads; and clients are evaluated before they
align (here after, by the library's one evaluation rule). The Fisher pass costs about one local epoch
and the alignment one epoch at batch 16, so a FedAS round takes about three times FedAvg's local work.

Verified (tests/test_fedas.py): the Fisher trace of a softmax regression equals the squared batch-mean
score gradients summed by hand, the bodies are averaged with the traces of the trained models as weights,
the alignment is one hand-computed gradient step towards the local prototypes (one full batch), and only
participants receive the body. Digits (sklearn's), 5 rounds, -lr 0.1, batch 10, one seed: 0.83 on 5 IID
clients (FedAvg 0.90), 0.95 on 6 clients with 2 classes each (FedAvg 0.62).
"""

from flcore.clients.clientas import FedASClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedASServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper=("Yang et al., CVPR 2024, "
               "[CVF](https://openaccess.thecvf.com/content/CVPR2024/html/Yang_FedAS_Bridging_Inconsistency_in_Personalized_Federated_Learning_CVPR_2024_paper.html)"),
        family=("pFL, shared body aligned to the client's class prototypes before use, local head; bodies "
                "averaged with Fisher-trace weights; `-dp` refused"),
        flags="`--align_lr` 0.01, `--align_epochs` 1, `--align_batch_size` 16",
        ala="yes: the aligned body, under the local head")
    """The family's weighted average of the uploaded bodies, the weight being each one's Fisher trace."""
    declares = Declares(
        client_class=FedASClient,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("its parameter alignment and the Fisher trace sent as aggregation weight use client data outside "
                     "the DP mechanism"),
        ),
        checkpoint_skip=("receivers",),  # rebuilt by every broadcast
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--align_lr", type=float, default=0.01,
                            help="SGD rate of the parameter alignment (official code: 0.01)")
        parser.add_argument("--align_epochs", type=int, default=1,
                            help="epochs of parameter alignment per received body (official code: 1)")
        parser.add_argument("--align_batch_size", type=int, default=16,
                            help="batch size of the parameter alignment (official code: 16)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.align_lr <= 0 or cfg.align_epochs < 0 or cfg.align_batch_size < 1:
            raise FLError("FedAS needs --align_lr > 0, --align_epochs >= 0 and --align_batch_size >= 1")

    def prepare_broadcast(self, participants) -> None:
        super().prepare_broadcast(participants)  # only the body goes down ...
        self.receivers = {c.id for c in participants}  # ... and only to the round's participants

    def broadcast(self, client):
        return super().broadcast(client) if client.id in self.receivers else None

    def new_client_payload(self, client):
        return super().broadcast(client)  # -nnc: the body, as a participant receives it
