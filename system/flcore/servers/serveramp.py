"""FedAMP: Personalized Cross-Silo Federated Learning on Non-IID Data.
Huang, Chu, Zhou, Wang, Liu, Pei, Zhang. AAAI 2021. https://arxiv.org/abs/2007.03797
Official code: no release located; reference port: PFLlib's serveramp.py (https://github.com/TsingZ0/PFLlib).

Relative to FedAvg this changes both sides. The server keeps every client's last uploaded model w_j and,
instead of one global model, sends each client i its own cloud model built by attentive message passing,

    u_i = Σ_j ξ_ij w_j,   every row of ξ summing to one,

so similar clients share more. Client i starts from u_i (ALA initialises from w_i and u_i with ``-ala``)
and trains with the proximal term (λ / (2 α_k)) ||w - u_i||^2; the result w_i is its personalised model:
it is what the client uploads and what is evaluated, every round, for every client (one that sits a round
out keeps its last w_i). u_i is only the next round's starting point and anchor, and only the round's
participants receive one; with ``-ala``, ALA shapes that starting point, never the evaluated w_i.

Two attention rules, ``--amp_kernel``:

- ``heur`` (default), HeurFedAMP, the paper's heuristic for clients whose models are deep networks: the
  self-weight ξ_ii is a hyperparameter and the rest is a softmax over scaled cosine similarities,
      ξ_ij = (1 - ξ_ii) exp(σ cos(w_i, w_j)) / Σ_{h≠i} exp(σ cos(w_i, w_h))   (j ≠ i).
  Flags ``--xi_ii`` = 0.8 and ``-sg`` σ = 1000 (the paper tunes both per data set; these are this
  library's, chosen at CPU scale). Models grown from one initialisation stay nearly parallel: on the
  4-layer CNN (Digits, Fashion-MNIST, 20 clients, 2 labels each, rounds 1-20) their cosine similarities
  lie within 0.992-0.9999, so σ must be large for the softmax to tell them apart; σ = 1000 turns that
  spread into weight ratios up to e^8 and gives 77-99 % of the neighbours' share to the clients that
  share a label (29 % of them). The spread, and so the σ that resolves it, depends on the model and on
  how long it has trained.
  ξ_ii = 0.8 keeps most of u_i the client's own (0.5 was less accurate on all four of those splits).
- ``euclid``, the paper's FedAMP with A(x) = 1 - exp(-x/σ): ξ_ij = α_k exp(-||w_i - w_j||^2 / σ) / σ
  (j ≠ i) and ξ_ii = 1 - Σ_{j≠i} ξ_ij. Flag ``-sg`` σ = 0.1. On a CNN, models drift apart by far more
  than σ within a round or two and the attention collapses onto ξ_ii ≈ 1 (FedAMP becomes Local); a
  warning says so when every client puts under 1 % of its weight on the others.

Common flags (PFLlib's names; the paper tunes the values per data set): ``-alk`` α_k = 0.005, ``-lam``
λ = 5e-5, so the proximal weight λ / α_k = 0.01 (FedProx's default weight here). With ``euclid``,
α_k / σ = 0.05 keeps every ξ_ii >= 0 (u_i a convex combination) for up to 21 clients; PFLlib's defaults
(1, 1, 1) make ξ_ii strongly negative whenever models are within about σ of each other (u_i then
extrapolates away from the neighbours), and a warning says so. Distances and similarities use the
parameters; the message passes every floating state entry. Clients that have not uploaded yet count with
the common initial model. Each evaluation records ``amp_other_weight``, the mean over clients of
1 - ξ_ii (the share of u_i that comes from the other clients).

Where PFLlib differs: it has only the Euclidean rule, with defaults α_k = λ = σ = 1 (no HeurFedAMP, no
ξ_ii flag); its proximal term is the non-squared norm ||w - u_i|| computed on detached tensors, so it
contributes no gradient (local training is then plain SGD); its clients never start from u_i (they keep
training w_i) and its server mixes only the models uploaded in the last round.
"""
import copy
import sys

import torch

from flcore.clients.clientamp import FedAMPClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.personal_aggregation import amp_attention, attentive_message, flat, pairwise_sq_dists

KERNELS = ("heur", "euclid")
SIGMA = {"heur": 1000.0, "euclid": 0.1}  # -sg default of each kernel
XI_II = 0.8  # --xi_ii default (heur)
COLLAPSE = 0.01  # warn when every client puts less than this share of its weight on the others


def pairwise_cosine(states, keys) -> torch.Tensor:
    """N x N matrix of cos(w_i, w_j) over the entries ``keys`` (a zero vector counts as orthogonal)."""
    w = torch.stack([flat(s, keys) for s in states])
    w = w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return w @ w.T


def heur_attention(cos: torch.Tensor, xi_ii: float, sigma: float) -> torch.Tensor:
    """HeurFedAMP's weights: ξ_ii on the diagonal, and off it a softmax over σ cos(w_i, w_j), j ≠ i,
    scaled to 1 - ξ_ii, so every row sums to one (a single client keeps all the weight)."""
    n = cos.shape[0]
    if n == 1:
        return torch.ones(1, 1, dtype=cos.dtype)
    logits = sigma * cos.clone()
    logits.fill_diagonal_(float("-inf"))
    xi = (1.0 - xi_ii) * torch.softmax(logits, dim=1)
    xi.fill_diagonal_(xi_ii)
    return xi


class FedAMPServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Huang et al., AAAI 2021, [arXiv 2007.03797](https://arxiv.org/abs/2007.03797)",
        family="pFL, attentive message passing (per-client cloud models; HeurFedAMP by default)",
        flags=("`--amp_kernel` heur, `--xi_ii` 0.8, `-sg` σ 1000 (heur) / 0.1 (euclid), `-alk` α_k 0.005, `-lam` "
               "λ 5e-5"),
        ala="yes: the training model, from w_i and the cloud model u_i; w_i is evaluated")
    declares = Declares(
        client_class=FedAMPClient,
        averaging_refusal="each client's cloud model is its own attention-weighted mix, not one average",
        pfllib_defaults={"alphaK": 1.0, "lamda": 1.0, "sigma": 1.0},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="its cloud model u_i mixes the stored models by the attention of client i's own model, "
                              "which a client that never trained does not have",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal="each client receives its own attention-weighted model, not one mean of updates",
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--amp_kernel", default="heur", choices=KERNELS,
                            help="attention rule: heur = HeurFedAMP (cosine similarity, self-weight --xi_ii, "
                                 "the paper's rule for deep networks), euclid = FedAMP's exp(-||w_i - w_j||^2/σ)")
        parser.add_argument("--xi_ii", type=float, default=None,
                            help=f"heur: self-attention weight ξ_ii, the others share 1 - ξ_ii (default: {XI_II} with heur)")
        parser.add_argument("-alk", "--alphaK", type=float, default=0.005,
                            help="message-passing step α_k; proximal weight is λ/α_k; euclid: keep α_k <= "
                                 "σ/(N-1) (PFLlib: 1.0)")
        parser.add_argument("-lam", "--lamda", type=float, default=5e-5,
                            help="attention regulariser weight λ; proximal weight is λ/α_k (PFLlib: 1.0)")
        parser.add_argument("-sg", "--sigma", type=float, default=None,
                            help=f"heur: scale σ of the cosine similarities in the softmax; euclid: scale σ of "
                                 f"A(x) = 1 - exp(-x/σ) (PFLlib: 1.0) (default: {SIGMA['heur']:g} with heur, "
                                 f"{SIGMA['euclid']:g} with euclid)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.alphaK <= 0 or (cfg.sigma is not None and cfg.sigma <= 0) or cfg.lamda < 0:
            raise FLError("FedAMP needs -alk > 0, -sg > 0 and -lam >= 0")
        if cfg.xi_ii is not None and cfg.amp_kernel != "heur":
            raise FLError("--xi_ii sets HeurFedAMP's self-weight; add --amp_kernel heur or drop --xi_ii")
        if cfg.xi_ii is not None and not 0 <= cfg.xi_ii <= 1:
            raise FLError(f"--xi_ii must be in [0, 1] (got {cfg.xi_ii})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init = {k: v.detach().clone() for k, v in self.global_model.state_dict().items()}
        self.client_states = [init] * len(self.clients)  # w_j as last uploaded
        self.param_keys = [n for n, _ in self.global_model.named_parameters()]
        self.sigma = self.cfg.sigma if self.cfg.sigma is not None else SIGMA[self.cfg.amp_kernel]
        self.xi_ii = self.cfg.xi_ii if self.cfg.xi_ii is not None else XI_II
        self.xi = None
        self.participant_ids: set[int] = set()
        self.warned = False  # ξ_ii < 0 (euclid)
        self.warned_collapse = False

    def attention(self) -> torch.Tensor:
        """ξ (N x N, rows summing to one) from the stored models, by ``--amp_kernel``."""
        if self.cfg.amp_kernel == "heur":
            return heur_attention(pairwise_cosine(self.client_states, self.param_keys), self.xi_ii, self.sigma)
        return amp_attention(pairwise_sq_dists(self.client_states, self.param_keys), self.cfg.alphaK, self.sigma)

    def prepare_broadcast(self, participants) -> None:
        """The round's attention weights ξ, from the stored models."""
        self.participant_ids = {c.id for c in participants}
        self.xi = self.attention()
        if not self.warned and bool((self.xi.diagonal() < 0).any()):
            self.warned = True
            print(f"WARNING: FedAMP self-attention ξ_ii < 0 in round {self.round_idx}: cloud models extrapolate; "
                  f"lower -alk below -sg/(N-1) = {self.sigma / max(len(self.clients) - 1, 1):.3g}", file=sys.stderr)
        others = 1.0 - self.xi.diagonal()
        if not self.warned_collapse and len(self.clients) > 1 and bool((others < COLLAPSE).all()):
            self.warned_collapse = True
            fix = (f"lower --xi_ii (now {self.xi_ii:g})" if self.cfg.amp_kernel == "heur" else
                   f"use --amp_kernel heur (the paper's rule for deep networks) or raise -sg (now {self.sigma:g})")
            print(f"WARNING: FedAMP attention collapsed in round {self.round_idx}: every client puts under "
                  f"{COLLAPSE:.0%} of its weight on the others (at most {float(others.max()):.2g}), so it trains "
                  f"like Local; {fix}", file=sys.stderr)

    def broadcast(self, client):
        """Each participant receives its own cloud model u_i; the others need none (they keep w_i)."""
        if client.id not in self.participant_ids:
            return None
        cloud = copy.deepcopy(self.global_model)
        cloud.load_state_dict(attentive_message(self.client_states, self.xi[client.id], client.id))
        return cloud

    def aggregate(self, uploads) -> None:
        """No averaging: the uploaded w_i replace the stored ones."""
        for u in uploads:
            self.client_states[u.id] = {k: v.detach().clone() for k, v in u.state.items()}

    def extra_metrics(self) -> dict:
        """The mean share of the cloud models that comes from the other clients, 1 - ξ_ii."""
        if self.xi is None:
            return {}
        return {"amp_other_weight": float((1.0 - self.xi.diagonal()).mean())}
