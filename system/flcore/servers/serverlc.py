"""FedLC: Federated Learning with Label Distribution Skew via Logits Calibration.
Zhang, Li, Li, Xu, Wu, Ding, Wu. ICML 2022. https://arxiv.org/abs/2209.00189

Relative to FedAvg this changes only the client's loss: before the softmax cross-entropy every logit is
calibrated by the client's own count of that class, n_{k,c} (its training samples of class c),

    z̃_c = z_c - τ n_{k,c}^{-1/4}   for every class c,      loss = -log softmax(z̃)_y,

i.e. loss = log(1 + Σ_{c≠y} exp(z_c - z_y + Δ_{y,c})) with the pairwise label margin
Δ_{y,c} = τ (n_{k,y}^{-1/4} - n_{k,c}^{-1/4}): a sample of a rare class must beat the frequent classes by a
wider margin, and a sample of a frequent class pushes the rare classes' logits down less, so local training
overfits less to the client's label skew. Aggregation is FedAvg's and the global model, used without
calibration, is the one evaluated (traditional FL). The softmax runs over all classes (the true one included),
as in PFLlib and FL-bench. A class the client has no sample of (n = 0) gets τ n^{-1/4} = +inf, the formula's
limit: its calibrated logit is -inf, i.e. it leaves this client's softmax (exp(-inf) = 0) and its logit gets
no gradient from this client; with τ = 0 the loss is plain cross-entropy (FedAvg). With ``-ala`` the local
model is initialised by ALA; the loss is unchanged.

The counts are the client's own, as in the paper (its margin corrects that client's label skew); PFLlib
calibrates every client by the counts summed over all clients, one margin for everyone, which leaves each
client's skew uncorrected (and on a pathological split gives a class a client has no sample of a finite
logit).

Flags: ``-tau`` τ = 1.0 (PFLlib's and FL-bench's default; the paper treats τ as a tuned hyper-parameter).

``-dp``: the calibrated loss is the DP-SGD objective (per-sample gradients clipped and noised); the label
counts in the calibration are a statistic of the client's whole training set that enters every sample's
loss, treated as public and not covered by the reported epsilon (``dp_support.uncovered``: a warning at start-up,
the same rule as FedRoD's balanced softmax).

Verified (tests/test_fedlc.py): calibrated logits and the loss against hand values (a missing class
included), ``-tau 0`` against FedAvg's numbers. Digits, 5 rounds, -lr 0.1: 0.90 (FedAvg 0.90) on an IID
split of 5 clients, whose near-equal counts (19-32 per class) make the calibration almost a constant shift;
0.54 (FedAvg 0.62) on a 6-client split with 2 classes each.
"""
from __future__ import annotations

from flcore.clients.clientlc import FedLCClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedLCServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhang et al., ICML 2022, [arXiv 2209.00189](https://arxiv.org/abs/2209.00189)",
        family=("traditional FL, CE of logits z_c − τ n_c^{−1/4} calibrated by the client's label counts (absent "
                "classes leave its softmax); under `-dp` the counts are not covered by the reported ε (a start-up "
                "warning)"),
        flags="`-tau` τ 1",
        ala="yes: the local model")
    declares = Declares(
        client_class=FedLCClient,
        pfllib_defaults={"tau": 1.0},
        personalized=False,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            uncovered=("FedLC's calibration, which reads the client's label counts (a statistic of all its data) in "
                       "every sample's loss"),
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-tau", "--tau", type=float, default=1.0,
                            help="calibration strength τ in z_c - τ n_c^(-1/4) (PFLlib and FL-bench: 1.0; 0 = FedAvg)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if not cfg.tau >= 0:
            raise FLError(f"-tau must be >= 0 for FedLC (got {cfg.tau})")
