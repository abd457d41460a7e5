"""FedNova: Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization.
Wang, Liu, Liang, Joshi, Poor. NeurIPS 2020. https://arxiv.org/abs/2007.07481
Official code: https://github.com/JYWa/FedNova

Relative to FedAvg this changes how the server weighs the updates. Client i runs τ_i local steps (``-ls``
epochs of ceil(n_i / ``-lbs``) batches, so τ_i grows with its data), and FedAvg's weighted mean of the
models then favours the clients that took more steps: it converges to the optimum of a surrogate objective
weighted by p_i τ_i, not of the true one (the paper's objective inconsistency). FedNova normalises each
update by the local solver's ||a_i||_1 (the sum of the coefficients with which the step gradients enter
x^t − x_i; τ_i for plain SGD) and rescales the mean to the effective step count τ_eff:

    d_i = (x^t − x_i) / ||a_i||_1,    x^{t+1} = x^t − τ_eff Σ_i p_i d_i,    τ_eff = Σ_i p_i ||a_i||_1

with p_i = n_i / Σ_j n_j over the round's uploads. When every ||a_i||_1 is equal (same τ_i, same solver)
this is FedAvg number for number. The local solver is the paper's general form: SGD with momentum ρ
(``-rho``) and the proximal term (μ/2)||x − x^t||² (``-mu``, FedProx's), ||a_i||_1 from
``clientfednova.a_norm`` (the paper's closed forms for each alone).

A client uploads its model x_i and ||a_i||_1 (``extras["a_norm"]``), the same information as d_i; the
server forms each normalised model x^t − τ_eff d_i and averages those through ``average_uploads`` with
the sample weights, whose mean is the update above. So ``--server_opt`` steps on the pseudo-gradient
τ_eff Σ_i p_i d_i (``avgm`` is the paper's FedNova with server momentum), and the upload attacks and the
privacy monitor see models, as FedAvg's. ``--aggregator`` is refused (``robust_refusal``): τ_eff, the mean of
the uploaded ||a_i||_1, rescales every update before any rule sees it, so one client's ||a_i||_1 would move
them all. Only parameters are normalised; BatchNorm statistics, which no
SGD step moves, are averaged as FedAvg's. With ``-ala`` the local model starts from ALA's initialisation
and x^t − x_i, which d_i normalises, includes that shift. ``--dp_level client`` is refused: its release is
one mean update, with no per-client ||a_i||_1 left to normalise by.

Flags: ``-rho`` ρ = 0 and ``-mu`` μ = 0 (the paper's vanilla FedNova, plain local SGD; its experiments
also run ρ = 0.9 and proximal updates). Where the official code differs, this follows the paper: there
the proximal gradient is added after the momentum buffer (here it is part of the loss, so inside the
buffer, and ||a_i||_1 follows that recursion), and with μ > 0 τ_eff is Σ_i p_i τ_i instead of
Σ_i p_i ||a_i||_1; its server momentum ``gmf`` is ``--server_opt avgm`` here. Verified against hand
computations and a reference loop (tests/test_fednova.py) and on the benchmark's splits (docs/benchmark.md).
"""
import dataclasses

from flcore.clients.clientfednova import FedNovaClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedNovaServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Wang et al., NeurIPS 2020, [arXiv 2007.07481](https://arxiv.org/abs/2007.07481)",
        family="traditional FL, normalised averaging: each update divided by its local solver's ‖a_i‖₁ (τ_i for "
               "plain SGD), the mean rescaled by τ_eff = Σ p_i ‖a_i‖₁; the normalised models pass `--server_opt`; "
               "`--aggregator` and `--dp_level client` refused",
        flags="`-rho` ρ 0, `-mu` μ 0 (the paper's vanilla FedNova)",
        ala="yes: the local model; its ALA shift is part of the normalised update")
    declares = Declares(
        client_class=FedNovaClient,
        personalized=False,
        dp_support=DPSupport(  # -dp: what it refuses (docs/privacy.md)
            client_refusal="its server normalises each client's update by that client's own ‖a_i‖₁, which the "
                           "release's one mean update no longer carries",
        ),
        # --aggregator: τ_eff, the mean of the uploaded ‖a_i‖₁, rescales every update outside the rule
        robust_refusal="its server rescales every update by the mean of the uploaded ‖a_i‖₁, outside the rule",
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-rho", "--rho", type=float, default=0.0,
                            help="local SGD momentum rho (FedNova paper: 0 vanilla, 0.9 in its momentum runs)")
        parser.add_argument("-mu", "--mu", type=float, default=0.0,
                            help="proximal weight mu of the local objective (FedNova paper's FedProx solver; 0 = off)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if not 0 <= cfg.rho < 1:
            raise FLError(f"-rho must be in [0, 1) for FedNova (got {cfg.rho})")
        if cfg.mu < 0 or cfg.mu * cfg.local_learning_rate >= 1:
            raise FLError(f"-mu must be >= 0 with -mu x -lr < 1 for FedNova (got -mu {cfg.mu}, -lr "
                          f"{cfg.local_learning_rate}): a larger proximal step overshoots the global model")

    def aggregate(self, uploads):
        if uploads:
            self.average_uploads(self.normalized(uploads))

    def normalized(self, uploads):
        """Each upload with its parameters replaced by x^t − τ_eff d_i = x^t + (τ_eff / ||a_i||_1)(x_i − x^t)
        (module docstring); their sample-weighted mean is FedNova's new model."""
        total = sum(u.weight for u in uploads)
        tau_eff = sum(u.weight * u.extras["a_norm"] for u in uploads) / total
        x = self.global_model.state_dict()
        params = {k for k, _ in self.global_model.named_parameters()}
        out = []
        for u in uploads:
            scale = tau_eff / u.extras["a_norm"]
            state = {k: x[k] + scale * (v.to(x[k].device) - x[k]) if k in params else v for k, v in u.state.items()}
            out.append(dataclasses.replace(u, state=state))
        return out
