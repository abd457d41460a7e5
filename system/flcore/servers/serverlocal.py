"""Local: every client trains only on its own data; no communication, no aggregation.

The lower bound every pFL method must beat on shared knowledge (and the upper bound on personalisation
in the most skewed splits). Each client keeps its own model from the common initialisation; the server
never sends nor averages anything (with ``--client_models`` each client trains its own architecture). No
flags of its own. ``-ala`` is rejected (there is no global model).
"""
from flcore.clients.clientlocal import LocalClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport


class LocalServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="— (no communication)",
        family="baseline",
        flags="—",
        ala="no: no global model")
    declares = Declares(
        client_class=LocalClient,
        averaging_refusal="nothing is aggregated",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal="its clients upload no model update",
        ),
        model_support=ModelSupport(refusal="", shares="nothing"),  # --client_models: each client its own architecture
    )


    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.ala:
            raise FLError("-ala needs a global model, and Local has none; drop -ala")

    def broadcast(self, client) -> None:
        """Nothing is sent: each client keeps its own model."""

    def aggregate(self, uploads) -> None:
        """Nothing is aggregated."""
