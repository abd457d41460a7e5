"""pFedMe: Personalized Federated Learning with Moreau Envelopes.
Dinh, Tran, Nguyen. NeurIPS 2020. https://arxiv.org/abs/2006.08848
Official code: https://github.com/CharlieDinh/pFedMe

Relative to FedAvg this changes both sides. Each client keeps a personalised model θ_i next to its local
copy w of the global model. Per local batch it solves the Moreau-envelope inner problem approximately with
K SGD steps of rate -lrp, then moves w toward θ_i with rate η = -lr:

    θ_i ≈ argmin_θ f_i(θ; batch) + (λ/2) ||θ - w||^2,      w ← w - η λ (w - θ_i).

The server mixes the plain mean of the uploaded w's into the global model: w^{t+1} = (1-β) w^t + β mean_i w_i.
θ_i (the personalised model) is what is evaluated; w is what is uploaded and what ALA initialises (``-ala``).

Flags (paper's non-convex MNIST settings, official README): ``-lam`` λ = 15, ``-K`` K = 5,
``-lrp`` personal rate 0.09, ``-bt`` β = 1 (the paper also reports β = 2 after tuning).

``-dp``: each of the K inner steps per batch takes the DP-SGD gradient of f(θ; batch) (per-sample clipped
and noised, one accountant step at q = -lbs / n each, so a round counts K times the batches of FedAvg); the
proximal gradient λ(θ - w) and w's step read no data and are added after the release.

Where the official code differs from the paper, this follows the paper: its server weights the mean by
sample counts (the paper: plain mean over the sampled clients), and its inner step adds a weight decay of
0.001 (the default ``mu`` of its pFedMe optimizer, which its client never sets; not in the paper). It
also trains every client each round and lets only the sampled ones upload; here, as in PFLlib, only the
sampled clients train. As in the official code, θ_i restarts from w at every local training.

Where PFLlib differs: it keeps the official code's sample weighting and weight decay; its defaults are
``-bt 0 -lam 1 -lrp 0.01`` (``-bt 0`` never moves the global model); and its "personalized" accuracy is
the global model's. Its optimizer returns the model's own parameter list as θ_i, so θ_i aliases the
model, which is set to w after training and to the received global model at every broadcast: the θ_i it
evaluates is the global model (until a client first trains, a separate copy of the initial model).
"""
from flcore.clients.clientpfedme import PFedMeClient
from flcore.servers.serverbase import Declares, Server
from utils.aggregate import weighted_average
from utils.errors import FLError
from utils.personal_aggregation import lerp_state


class PFedMeServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Dinh et al., NeurIPS 2020, [arXiv 2006.08848](https://arxiv.org/abs/2006.08848)",
        family="pFL, Moreau-envelope regularisation (personal θ_i, local w)",
        flags="`-lam` λ 15, `-K` 5, `-lrp` 0.09, `-bt` β 1",
        ala="yes: the local copy w; θ_i restarts from it")
    declares = Declares(
        client_class=PFedMeClient,
        averaging_refusal="its server steps the mean by its own β",
        pfllib_defaults={"lamda": 1.0, "K": 5, "p_learning_rate": 0.01, "beta": 0.0},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-lam", "--lamda", type=float, default=15.0,
                            help="Moreau-envelope weight λ (pFedMe paper, MNIST: 15)")
        parser.add_argument("-K", "--K", type=int, default=5, help="inner steps per batch (pFedMe paper: 5)")
        parser.add_argument("-lrp", "--p_learning_rate", type=float, default=0.09,
                            help="personal (inner) learning rate (pFedMe paper, non-convex MNIST: 0.09)")
        parser.add_argument("-bt", "--beta", type=float, default=1.0,
                            help="server mixing β; 1 = plain mean (pFedMe paper: 1, tuned: 2)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.K < 1 or cfg.lamda < 0 or cfg.p_learning_rate <= 0 or cfg.beta <= 0:
            raise FLError("pFedMe needs -K >= 1, -lam >= 0, -lrp > 0 and -bt > 0")

    def aggregate(self, uploads) -> None:
        """w^{t+1} = w^t + β (mean_i w_i - w^t), the mean unweighted as in the paper."""
        if not uploads:
            return
        mean = weighted_average([u.state for u in uploads], [1.0] * len(uploads))
        self.load_aggregate(self.global_model, lerp_state(self.global_model.state_dict(), mean, self.cfg.beta))
