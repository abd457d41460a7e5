"""FedDBE: Eliminating Domain Bias for Federated Learning in Representation Space.
Zhang, Hua, Cao, Wang, Song, Xue, Ma, Guan. NeurIPS 2023. https://arxiv.org/abs/2311.14975
Official code: https://github.com/TsingZ0/DBE (FedAvg + DBE, the variant implemented here).

Relative to FedAvg this changes the local model and objective; the server still averages the whole
network (body φ = ``base`` and classifier h = ``head``, sample-weighted). The domain bias eliminator adds
to each client:

- PRBM, a personal representation bias memory: a learnable vector z̄^p_i of the feature size, zero at
  first, added to the body's features before the classifier, z_i = z^g_i + z̄^p_i with z^g_i = φ(x). It
  is trained with the model (same SGD, ``-lr``) and never leaves the client (``personal_keys``); every
  client is evaluated on h(φ(x) + z̄^p_i).
- MR, mean regularization: the running mean of this round's features, r ← (1 − μ) r + μ mean_batch φ(x)
  (reset to 0 at the start of each round's training, the previous value a constant), is pulled to a
  global mean z̄^g:

      L_i = CE(h(φ(x) + z̄^p_i), y) + κ · mean_k ½ (r_k − z̄^g_k)².

z̄^g is fixed once, in an initialization period before round 0: every client trains a copy of the
initial model for ``-ls`` epochs with plain cross-entropy (no PRBM, no MR), tracking r; the server takes
the sample-weighted mean of the clients' r, z̄^g = Σ_i n_i r_i / Σ_i n_i, and sends it with round 0's
model (the copies are dropped: round 0 starts from the initial model), as the official code does.
The means' bytes are counted in round 0's traffic.

Flags: ``-mo`` μ = 1.0 and ``-klw`` κ = 50: the official code's run script for the paper's setting
(``-mo 1 -klw 50``; μ = 1 makes r the batch's own mean). PFLlib's defaults are ``-mo 0.1 -klw 0.0``, which
switch MR off; pass them to reproduce PFLlib. ``-ala``: the body and classifier are received whole, so ALA
initialises them from the global model under the client's own PRBM. ``-dp`` is refused: MR takes the mean
feature of a batch (one sample's loss depends on the others', so per-sample gradients are undefined) and
carries it across batches in the running mean.

Where PFLlib differs: the defaults above (its FedDBE is the official code), and with ``-ld`` the PRBM's rate
decays with the model's here (PFLlib's separate PRBM optimizer keeps ``-lr``).
"""
import torch

from flcore.clients.clientdbe import DBEModel, FedDBEClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.comm import payload_bytes
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedDBEServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhang et al., NeurIPS 2023, [arXiv 2311.14975](https://arxiv.org/abs/2311.14975)",
        family=("pFL model splitting; client: CE(h(φ(x) + z̄_p)) + κ·½‖r − z̄_g‖², r the running feature mean "
                "(momentum μ, reset each round), z̄_p (PRBM) local; server: FedAvg of body + head, sends z̄_g "
                "once after an initialisation period; `-dp` refused"),
        flags="`-mo` μ 1.0, `-klw` κ 50",
        ala="yes")
    declares = Declares(
        client_class=FedDBEClient,
        pfllib_defaults={"momentum": 0.1, "kl_weight": 0.0},
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal=("its mean regularisation uses each batch's mean feature and a running mean across batches, so "
                     "per-sample gradients are undefined"),
        ),
        checkpoint_skip=("payload",),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-mo", "--momentum", type=float, default=1.0,
                            help="momentum μ of the features' running mean (official run script: 1; PFLlib 0.1)")
        parser.add_argument("-klw", "--kl_weight", type=float, default=50.0,
                            help="weight κ of the mean regularization (official run script: 50; PFLlib 0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if not 0 < cfg.momentum <= 1 or cfg.kl_weight < 0:
            raise FLError(f"FedDBE needs 0 < -mo <= 1 and -klw >= 0 (got -mo {cfg.momentum}, -klw {cfg.kl_weight})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_mean: torch.Tensor | None = None
        self.payload = None

    def build_model(self):
        return DBEModel(super().build_model())  # its prbm stays at 0: never uploaded, never used

    def initialization_period(self) -> torch.Tensor:
        """z̄^g: the sample-weighted mean of every client's running mean after its initial training."""
        results = self.call_clients(self.clients, "initial_mean")
        self.bytes_up += payload_bytes([m for _, m in results])
        total = sum(w for w, _ in results)
        return sum(w * m.to(self.device) for w, m in results) / total

    def prepare_broadcast(self, participants) -> None:
        """The first broadcast runs the initialization period and carries z̄^g; later ones only the model."""
        first = self.global_mean is None
        if first:
            self.global_mean = self.initialization_period()
        super().prepare_broadcast(participants)
        self.payload = {"model": self.shared_part, "mean": self.global_mean if first else None}

    def broadcast(self, client):
        return self.payload

    def new_client_payload(self, client):
        return {"model": self.shared_part, "mean": self.global_mean}  # -nnc: it missed the first broadcast's z̄^g
