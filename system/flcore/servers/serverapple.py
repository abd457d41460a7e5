"""APPLE: Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning.
Luo, Wu. IJCAI 2022. https://arxiv.org/abs/2110.08394
Official code: https://github.com/ljaiverson/pFL-APPLE

Relative to FedAvg there is no global model. Each client i uploads a core model θ_i and keeps a directed
relationship vector p_i (one weight per client). Its personalised model mixes the downloaded core models,

    θ̃_i = Σ_j p_ij θ_j,    min_{θ_i, p_i}  CE(θ̃_i) + λ(r) μ ||p_i - p^0||^2,

trained on θ_i (its gradient is p_ii ∇_θ̃ L) and on p_i (∂L/∂p_ij = <∇_θ̃ L, θ_j> + 2 λ(r) μ (p_ij - p^0_j)),
the other cores fixed, by one SGD with momentum 0.9 that is created afresh every round (the momentum
restarts at zero each round), as in the official code. p^0 (also p_i's start) holds the clients' shares of
the training samples, so the first personalised model is FedAvg's; λ(r) decays to 0 over the first -L
fraction of the rounds: λ(r) is 0 from round int(L·R) on, so with int(-L · -gr) = 0 (-gr < 10 at the
default -L 0.1) the pull is off from the start, as in the official code, whose schedule covers the same
int(L·R) rounds (the paper's λ(r) decays over the first L·R rounds and gives no rule for L·R < 1). The
server only stores the latest core of every client and sends all of them.

Step size (the default follows the official code): the core's rate is -lr times ``--core_lr_scale`` 2, so
the library's default -lr 0.005 gives the official 0.01; with momentum 0.9 a steady step is 10 times the
rate, and the core's gradient carries p_ii ~ 1/N, so the core moves about 0.1/N per unit of ∇_θ̃ L (FedAvg
at -lr 0.005: 0.005; equal at N = 20). p's rate is -dlr; -ld decays both rates, as the official code's
decay does. PFLlib instead uses plain SGD with the core's rate scaled by N: ``--sgd_momentum 0
--core_lr_scale N`` (N the number of clients), a step of -lr per unit of ∇_θ̃ L for any N. Either way the
personalised model moves only p_ii of its core's step during local training, while the next round's mix
takes all of it: a round is one long step, so APPLE wants smaller rates than FedAvg (-lr 0.1 diverges with
5 clients), and on IID data, where every core is alike, p's gradients are alike too and grow every p_ij
together (a scaled-up model) until the run collapses; the paper's setting is non-IID cross-silo data.

Flags (official code's defaults): ``-dlr`` 0.001, ``-mu`` μ = 0.1, ``-L`` 0.1, ``--lambda_schedule``
cosine (the official code also offers ``exponential``, its default), ``--sgd_momentum`` 0.9,
``--core_lr_scale`` 2 (see above). p_i is unconstrained, as there. The limited-bandwidth variant
(download M cores) is not implemented. ``-ala`` is rejected: no single global model is received; ``-dp``
is rejected: DP-SGD privatises model gradients, and p_i is not part of a model. The official code draws
every client's first core independently; here all start from the common initialisation (FedAvg's start).

Where PFLlib differs: plain SGD with the core's rate scaled by N (above), p_i starts at 1/N, the inner
product <∇L, θ_j> is replaced by a mean of per-tensor means, its proximal term is half the official one
(μ λ (p - p^0) as gradient), and its defaults ``-dlr 0 -mu 0`` freeze p_i.

Verified (tests/test_apple.py, tests/test_baselines_b.py): the start is FedAvg's mix, p's gradient is the
inner product plus the proximal pull, a round's steps are momentum-SGD steps on the p_ii-scaled core
gradient and on p, and the momentum restarts each round. Digits (sklearn's, 20 clients with 2 classes
each, batch 10, one seed): 30 rounds at the defaults 0.987 (Local 0.889; plain SGD at -lr: 0.51); 20
rounds at -lr 0.005 0.845 (best 0.938; PFLlib's scaling 0.854; Local 0.840, FedAvg 0.406); at -lr 0.1
0.889 (best 0.962; Local 0.984, FedAvg 0.843). On 5 IID clients it collapses as described above.
"""
import torch

from flcore.clients.clientapple import APPLEClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError


class APPLEServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Luo & Wu, IJCAI 2022, [arXiv 2110.08394](https://arxiv.org/abs/2110.08394)",
        family="pFL, learned mix of all clients' core models",
        flags=("`-dlr` 0.001, `-mu` 0.1, `-L` 0.1, `--lambda_schedule` cosine, `--core_lr_scale` 2, "
               "`--sgd_momentum` 0.9 (the official code's core optimiser)"),
        ala="no: no global model is received (`-ala` is rejected)")
    declares = Declares(
        client_class=APPLEClient,
        averaging_refusal="its server keeps every client's core model; none is averaged",
        pfllib_defaults={"dr_learning_rate": 0.0, "mu": 0.0, "L": 1.0},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="a personal model mixes the trained clients' core models by the client's own learnt "
                              "weights, one per trained client, and its own core is one of them",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal="its relationship vector p is trained on client data outside the DP path",
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-dlr", "--dr_learning_rate", type=float, default=0.001,
                            help="learning rate of the relationship vector p (official code: 0.001)")
        parser.add_argument("-mu", "--mu", type=float, default=0.1,
                            help="weight μ of the proximal term on p (official code: 0.1)")
        parser.add_argument("-L", "--L", type=float, default=0.1,
                            help="fraction of the rounds over which λ(r) decays to 0 (official code: 0.1)")
        parser.add_argument("--lambda_schedule", default="cosine", choices=["cosine", "exponential"],
                            help="shape of λ(r) (both in the official code)")
        parser.add_argument("--core_lr_scale", type=float, default=2.0,
                            help="factor on -lr for the core model's rate (2 with -lr 0.005 gives the official "
                                 "code's 0.01; PFLlib: N, with --sgd_momentum 0)")
        parser.add_argument("--sgd_momentum", type=float, default=0.9,
                            help="momentum of the SGD on the core model and p, restarted every round "
                                 "(official code: 0.9; PFLlib: 0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.ala:
            raise FLError("-ala needs a received global model; APPLE's personalised model is a learned mix of "
                          "the clients' core models, so drop -ala")
        if (cfg.dr_learning_rate < 0 or cfg.mu < 0 or not 0 <= cfg.L <= 1 or cfg.core_lr_scale <= 0
                or not 0 <= cfg.sgd_momentum < 1):
            raise FLError("APPLE needs -dlr >= 0, -mu >= 0, 0 <= -L <= 1, --core_lr_scale > 0 and "
                          "0 <= --sgd_momentum < 1")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init = {k: v.detach().clone() for k, v in self.global_model.state_dict().items()}
        self.cores = [init] * len(self.clients)  # θ_j as last uploaded (all start from the common init)
        n = torch.tensor([float(c.train_samples) for c in self.clients])
        self.p0 = n / n.sum()  # p^0: the clients' shares of the training samples

    def prepare_broadcast(self, participants) -> None:
        self.payload = {"cores": list(self.cores), "p0": self.p0}  # one object: pickled once per worker

    def broadcast(self, client) -> dict:
        """Every client gets all core models (and p^0) and rebuilds its personalised model."""
        return self.payload

    def aggregate(self, uploads) -> None:
        for u in uploads:
            self.cores[u.id] = {k: v.detach().clone() for k, v in u.state.items()}
