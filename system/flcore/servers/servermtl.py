"""FedMTL: Federated Multi-Task Learning (the regularised MTL objective, without MOCHA's dual solver).
Smith, Chiang, Sanjabi, Talwalkar. NeurIPS 2017. https://arxiv.org/abs/1705.10467
Official code (MOCHA): https://github.com/gingsmith/fmtl

Relative to FedAvg there is no shared model: every client t keeps its own model w_t, and the models are
coupled through the paper's general MTL objective with its regulariser R,

    min_W Σ_t F_t(w_t) + R(W, Ω),   R(W, Ω) = λ1 tr(W Ω W^T) + λ2 ||W||_F^2,   W = [w_1 .. w_m],

where Ω ∈ R^{m×m} holds the task relationships. Ω here is the paper's mean-regularised choice,
Ω = (I - (1/m) 1 1^T)^2 = I - (1/m) 1 1^T, for which tr(W Ω W^T) = Σ_t ||w_t - w̄||^2: every model is
pulled toward the mean of all m models. Each round the server sends client t its coupling
c_t = Σ_{s≠t} Ω_ts w_s (from every client's latest upload) and Ω_tt; the client takes ``-ls`` epochs of
SGD on F_t(w_t) + λ1 (Ω_tt ||w_t||^2 + 2 <w_t, c_t>) + λ2 ||w_t||^2, whose gradient in w_t is R's
(others fixed), and uploads w_t. The server's ``global_model`` is the plain mean w̄ of the m models (what
the regulariser pulls toward); clients are evaluated on their own models. F_t is the client's mean loss,
as in the official code's primal objective (Σ_t mean loss_t + (λ/2) tr(W Ω W^T), so its λ is 2 λ1 here).

Not implemented: the learned Ω of the paper's experiments and the official code (after each outer
iteration Σ = (W^T W)^{1/2} / tr((W^T W)^{1/2}), Ω = Σ^{-1}, solved there by MOCHA's dual method). From the
common initialisation W^T W is nearly singular, so Ω's eigenvalues are huge and plain SGD on the coupled
objective diverges unless the step shrinks accordingly; the fixed mean-regularised Ω is the variant run.

``-ala`` is refused (there is no global model to initialise from); ``-dp`` works: the penalty is part
of the ``loss`` hook, so every step is a DP-SGD step.

Flags: ``-lam`` λ1 = 0.01 and ``--lamda2`` λ2 = 0. The paper tunes λ per data set (linear models) and
gives no default for neural networks; 0.01 is this library's choice: on the behaviour harness's Digits
splits (5 rounds, -lr 0.1) λ1 = 0.1 already slows learning on IID data below Local's (each model is held
near the previous round's mean), λ1 = 1 stalls it. λ1 = 0 is Local.

Where PFLlib's FedMTL differs (not repeated here): its Ω is built from a matrix of ones instead of the
identity, so after it takes the square root of Ω's [0][0] entry the penalty is ||W||^2 + (1 - 1/m)^2
||Σ_t w_t||^2 (it pushes the *sum* of the models toward zero, not each model toward the mean); both terms
are scaled by 10^-(digits of the parameter count + 1) in place of λ; W holds only the round's selected
clients, in selection order, so client t's column changes from round to round; W flattens buffers too;
and ``-itk`` (default 4000) is read but used only in commented-out code (chunking W's rows), so ``-itk``
is accepted here (PFLlib command lines run) and has no effect, with a warning.
"""
import sys

import torch

from flcore.clients.clientmtl import FedMTLClient
from flcore.servers.serverbase import Declares, Server
from utils.aggregate import weighted_average
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedMTLServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Smith et al., NeurIPS 2017, [arXiv 1705.10467](https://arxiv.org/abs/1705.10467)",
        family=("pFL, per-client models coupled by λ1 tr(W Ω Wᵀ) + λ2 ‖W‖², Ω = I − 11ᵀ/m (mean-regularised; no "
                "MOCHA solver, Ω fixed)"),
        flags="`-lam` λ1 0.01, `--lamda2` λ2 0 (`-itk` accepted, no effect)",
        ala="no: no global model (`-ala` rejected)")
    declares = Declares(
        client_class=FedMTLClient,
        averaging_refusal="its server keeps every client's model for the task-relationship term",
        pfllib_defaults={"lamda": 1.0, "itk": 4000},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="the coupling of client t is row t of the relationship matrix Omega, learnt only over the "
                              "trained clients",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal="each client keeps and receives its own model, not one mean of updates",
        ),
        checkpoint_skip=("couplings",),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-lam", "--lamda", type=float, default=0.01,
                            help="λ1, weight of tr(W Ω W^T) (Smith et al. tune it per data set)")
        parser.add_argument("--lamda2", type=float, default=0.0, help="λ2, weight of ||W||_F^2")
        parser.add_argument("-itk", "--itk", type=int, default=None,
                            help="PFLlib's flag (MOCHA iterations), read only in commented-out code there; "
                                 "accepted so PFLlib command lines run, no effect (default: unset)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.itk is not None:
            print(f"warning: -itk {cfg.itk} has no effect (FedMTL here solves the regularised objective by SGD)",
                  file=sys.stderr)
        if cfg.ala:
            raise FLError("-ala initialises a local model from a global one; FedMTL's clients keep their own models "
                          "with no global model to receive, so drop -ala")
        if cfg.lamda < 0 or cfg.lamda2 < 0:
            raise FLError(f"FedMTL needs -lam >= 0 and --lamda2 >= 0 (got {cfg.lamda}, {cfg.lamda2})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        m = len(self.clients)
        self.omega = torch.eye(m, dtype=torch.float64) - 1.0 / m
        # W: every client's latest model state, the common initialisation until it first uploads.
        start = {k: v.detach().clone() for k, v in self.global_model.state_dict().items()}
        self.models = [{k: v.clone() for k, v in start.items()} for _ in range(m)]
        self.couplings: list[dict] | None = None

    def prepare_broadcast(self, participants) -> None:
        """c_t = Σ_{s≠t} Ω_ts w_s for every client t at once, parameter by parameter."""
        off = self.omega - torch.diag(torch.diag(self.omega))
        names = [k for k, _ in self.global_model.named_parameters()]
        self.couplings = [{} for _ in self.models]
        for k in names:
            stacked = torch.stack([s[k] for s in self.models]).to(torch.float64)  # m x shape
            mixed = torch.tensordot(off.to(stacked.device), stacked, dims=1).to(self.models[0][k].dtype)
            for t, c in enumerate(self.couplings):
                c[k] = mixed[t].clone()  # its own storage: a view would carry all m rows to every client

    def broadcast(self, client):
        return {"coupling": self.couplings[client.id], "omega_tt": float(self.omega[client.id, client.id])}

    def aggregate(self, uploads) -> None:
        """Keep each upload as its client's column of W; the global model is the mean of all columns."""
        if not uploads:
            return
        for u in uploads:
            self.models[u.id] = {k: v.detach().clone() for k, v in u.state.items()}
        self.load_aggregate(self.global_model, weighted_average(self.models, [1.0] * len(self.models)))
