"""SCAFFOLD: Stochastic Controlled Averaging for Federated Learning.
Karimireddy, Kale, Mohri, Reddi, Stich, Suresh. ICML 2020. https://arxiv.org/abs/1910.06378

Relative to FedAvg this adds control variates: the server's c and each client's c_i (zero at first). Each
local step uses the corrected gradient g - c_i + c; after its K steps (``Client.steps_per_round``) from
the received x to y_i, a client sets c_i+ = c_i - c + (x - y_i) / (K η_l) (the paper's option II) and
sends y_i and Δc_i = c_i+ - c_i. The server averages the participants' models without weights,
x ← x + η_g (mean_i y_i - x), and sets c ← c + (1/N) Σ_i Δc_i over all N clients.

Flags: ``-slr`` η_g = 1.0 (PFLlib's name and default). PFLlib's port averages the same way (models over the
participants, Δc over all N) with K = epochs x batches. With ``-ala`` the x in c_i+ is the ALA-initialised
start of the local steps.
"""
import torch

from flcore.clients.clientscaffold import SCAFFOLDClient
from flcore.servers.serverbase import Declares, Server
from utils.aggregate import weighted_average
from utils.dp_support import DPSupport
from utils.personal_aggregation import lerp_state


class SCAFFOLDServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Karimireddy et al., ICML 2020, [arXiv 1910.06378](https://arxiv.org/abs/1910.06378)",
        family="traditional FL, control variates",
        flags="`-slr` η_g 1.0",
        ala="yes: the local model; the x of c_i's update is the ALA-initialised start")
    declares = Declares(
        client_class=SCAFFOLDClient,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal=("its clients also upload control-variate updates, which the clipped model update does not "
                            "bound"),
        ),
        personalized=False,
        slr_default=1.0,  # -slr: the global step size η_g (SCAFFOLD paper and PFLlib: 1)
        averaging_refusal="its server steps the mean by its own -slr and control variates",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.c = {k: torch.zeros_like(p) for k, p in self.global_model.named_parameters()}

    def broadcast(self, client):
        return {"model": self.global_model, "c": self.c}

    def aggregate(self, uploads):
        if not uploads:
            return
        mean = weighted_average([u.state for u in uploads], [1.0] * len(uploads))
        step = lerp_state(self.global_model.state_dict(), mean, self.cfg.server_learning_rate)
        self.load_aggregate(self.global_model, step)
        n = len(self.clients)
        self.c = {k: c + sum(u.extras["dc"][k] for u in uploads) / n for k, c in self.c.items()}
