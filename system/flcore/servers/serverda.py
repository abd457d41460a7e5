"""PFL-DA: Personalized Federated Learning via Domain Adaptation with an Application to Distributed 3D
Printing. Shi, Kontar. Technometrics 65(3), 2023. https://doi.org/10.1080/00401706.2022.2157882
(no arXiv version or official code; this follows PFLlib's port, serverda.py / clientda.py).

Relative to FedAvg this changes what is shared and how clients train. Each client keeps its own body φ_i
(``base``) and personal head h_i (``head``), both never uploaded, and trains a copy of the global head h_g
(``ghead``); only h_g crosses the wire and is averaged (sample-weighted). A round on client i, after
receiving h_g:

    h_i      ← SGD^{ls}( CE(h_i(φ_i(x)), y) + λ ||h_i − h_g||₂ ;  φ_i, h_g fixed )
    φ_i, h_g ← SGD^{ls}( CE(h_g(φ_i(x)), y) ;  h_i fixed ),        h_g ← Σ_i (n_i / Σ_j n_j) h_g,i.

The body adapts each client's inputs to the shared classifier (the domain-adaptation reading: a covariate
shift is absorbed by φ_i, a concept shift by h_i, which λ ties to h_g). Clients are evaluated on their
personal model h_i(φ_i(x)). Both heads start as copies of the initial head. The norm is not squared, as
in PFLlib; its gradient at h_i = h_g is taken as 0.

Flags: ``-lam`` λ = 1.0 (PFLlib's default; the paper's own value was not available to check). ``-ls``
epochs for each of the two phases. ``-ala`` is refused: the only received part is the global head, which
the personal prediction does not use. ``-dp``: both phases are DP-SGD (their objectives through the base
training loop; the λ term is data-free).

Where PFLlib differs: PFLlib builds the λ term from ``.data`` copies of both heads, so it carries no
gradient and λ has no effect there (``-lam 0`` here reproduces PFLlib's updates); here it regularises h_i.
"""
from flcore.clients.clientda import DAModel, PFLDAClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.errors import FLError


class PFLDAServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Shi & Kontar, Technometrics 2023 (PFLlib's port)",
        family=("pFL model splitting; personal head on CE + λ‖h_i − h_g‖₂ (body frozen), then personal body + "
                "global head on CE(h_g(φ_i(x))); only the global head is averaged"),
        flags="`-lam` 1.0",
        ala="refused")
    declares = Declares(
        client_class=PFLDAClient,
        pfllib_defaults={"lamda": 1.0},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-lam", "--lamda", type=float, default=1.0,
                            help="weight λ of ||h_i - h_g||₂ on the personal head (PFLlib: 1.0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.ala:
            raise FLError("-ala needs a received global model, but PFL-DA receives only the global head, which "
                          "its personal model does not use; drop -ala")
        if cfg.lamda < 0:
            raise FLError(f"PFL-DA needs -lam >= 0 (got {cfg.lamda})")

    def build_model(self):
        return DAModel(super().build_model())  # only ghead is ever averaged
