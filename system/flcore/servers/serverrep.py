"""FedRep: Exploiting Shared Representations for Personalized Federated Learning.
Collins, Hassani, Mokhtari, Shakkottai. ICML 2021. https://arxiv.org/abs/2102.07078
Official code: https://github.com/lgcollins/FedRep

Relative to FedAvg this changes what is shared and how clients train. The model is cut into a body φ
(``base``) and a head h_i (``head``, the classifier; ``flcore.trainmodel.parts.split_head``). Each
round, client i takes the global body, trains its own head with the body frozen, then the body with its
head frozen:

    h_i ← SGD^{pls}(h_i; φ fixed),   φ_i ← SGD^{ls}(φ; h_i fixed),   φ ← Σ_i (n_i / Σ_j n_j) φ_i.

Only bodies are uploaded and averaged; heads never leave the clients. With ``-ala`` the body is
initialised by ALA from the global body (its top ``-p`` layers of the *body* are adapted, the loss
taken through the client's own head).

Flags: ``-pls`` head epochs = 10 (the paper, §5: "ten local epochs to train the local head, followed by
one or five epochs for the representation"; PFLlib's default is 1); ``-ls`` body epochs = 1.
A round is therefore 11 local epochs (``-pls`` + ``-ls``) where FedAvg's is ``-ls``: under the FedALA
paper's protocol (``-ls 1``), 10 head epochs and 1 body epoch, 11 passes over the local data against
FedAvg's one (the head epochs' backward pass stops at the head). The official code's scripts run the
same split (``--local_ep 11 --local_rep_ep 1``).
"""
from flcore.clients.clientrep import FedRepClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.errors import FLError


class FedRepServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Collins et al., ICML 2021, [arXiv 2102.07078](https://arxiv.org/abs/2102.07078)",
        family="pFL, shared body + local head",
        flags="`-pls` 10 head epochs (`-ls` body epochs)",
        ala="yes: the body, its top `-p` body layers adapted under the local head")
    declares = Declares(
        client_class=FedRepClient,
        pfllib_defaults={"plocal_epochs": 1},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-pls", "--plocal_epochs", type=int, default=10,
                            help="head epochs per round, body frozen (FedRep paper §5: 10)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.plocal_epochs < 0:
            raise FLError(f"-pls must be >= 0 (got {cfg.plocal_epochs})")

    def aggregate(self, uploads: list[dict]) -> None:
        """Sample-weighted mean of the uploaded bodies; the global head is never used."""
        if uploads:
            self.average_uploads(uploads, self.global_model.base)
