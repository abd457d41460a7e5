"""FedCAC: Bold but Cautious: Unlocking the Potential of Personalized Federated Learning through Cautiously
Aggressive Collaboration. Wu, Liu, Niu, Zhu, Tang. ICCV 2023. https://arxiv.org/abs/2309.11103
Official code: https://github.com/kxzxvbk/Fling (FedCAC).

Relative to FedAvg this changes what each client starts a round from. After local training from θ_i to
θ'_i, client i marks each parameter tensor's critical entries, the top τ fraction by sensitivity
s = |θ'_i ⊙ (θ'_i − θ_i)|, as a mask m_i, and uploads θ'_i with m_i. The server averages the models into
the global θ_g (sample-weighted, as FedAvg) and, over the round's uploaders, rates how far the critical
sets of clients i and j overlap and which clients collaborate on i's critical parameters:

    o_ij = 1 − ||m_i − m_j||₁ / (2 ||m_i||₁),
    T_t = mean_{i≠j} o_ij + (t + 1) / β · (max_{i≠j} o_ij − mean_{i≠j} o_ij),
    C_i = {i} ∪ {j : o_ij ≥ T_t},   θ̄_i = mean_{j ∈ C_i} θ'_j,
    θ_i ← m_i ⊙ θ̄_i + (1 − m_i) ⊙ θ_g     (the model client i starts round t + 1 from).

Non-critical parameters thus come from every client; critical ones only from clients whose critical
parameters sit in similar places, a set that shrinks to the client itself after β rounds (T_t ≥ max).
The server composes θ_i and sends it (one model per client); a client without a new upload keeps its
critical entries and takes the rest from θ_g. BatchNorm statistics come from θ_g (``--bn_stats shared``).

Flags: ``-tau`` τ = 0.5 and ``-bt`` β = 100, the official code's CIFAR-10 configuration (its CIFAR-100 one is
τ 0.4, β 170: pass ``-tau 0.4 -bt 170`` for 100-class splits); PFLlib's generic ``-tau 1.0 -bt 0``: τ = 1
makes every moved parameter critical, and β = 0 fails PFLlib's own assertion. Any β > 0 is taken as
is; PFLlib casts β to an integer. ``-ala`` is refused: each client starts from its own composition, not
from one global model. ``-dp``: local training is DP-SGD; the masks and the composition are functions of
the DP-trained models (post-processing).

Where PFLlib differs: a tensor whose entries did not move at all has no critical entries here (PFLlib's
threshold falls to 0 and marks all of them critical); the rest is PFLlib's and the official code's rule.
"""
import torch

from flcore.clients.clientcac import FedCACClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError


def overlap_rates(masks: torch.Tensor) -> torch.Tensor:
    """o_ij = 1 − Σ|m_i − m_j| / (2 Σ m_i) for 0/1 masks (one client a row); the diagonal is 1."""
    m = masks.double()
    diff = torch.cdist(m, m, p=1)  # Σ_k |m_ik − m_jk|
    return 1 - diff / (2 * m.sum(1, keepdim=True).clamp(min=1))


def collaborators(overlap: torch.Tensor, progress: float) -> list[list[int]]:
    """C_i = {i} ∪ {j ≠ i : o_ij ≥ mean + progress · (max − mean)} over the off-diagonal o_ij, with
    ``progress`` = (t + 1) / β."""
    n = overlap.shape[0]
    if n < 2:
        return [[i] for i in range(n)]
    off = overlap[~torch.eye(n, dtype=torch.bool)]
    mean, top = off.mean(), off.max()
    threshold = mean + progress * (top - mean)
    return [[i] + [j for j in range(n) if j != i and overlap[i, j] >= threshold] for i in range(n)]


class FedCACServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Wu et al., ICCV 2023, [arXiv 2309.11103](https://arxiv.org/abs/2309.11103)",
        family=("pFL personalized aggregation; client: local SGD, then per-tensor top-τ critical masks by "
                "abs(θ'(θ'−θ)); server: FedAvg θ_g and per client m_i·mean(collaborators) + (1−m_i)·θ_g, "
                "collaborators by mask overlap ≥ mean + (t+1)/β·(max − mean)"),
        flags="`-tau` 0.5, `-bt` β 100 (official CIFAR-10 config)",
        ala="refused")
    declares = Declares(
        client_class=FedCACClient,
        averaging_refusal="each client starts from its own mean over its collaborators' critical parameters",
        pfllib_defaults={"tau": 1.0, "beta": 0.0},
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal=("its clients also upload their critical-parameter masks, and each client receives its own "
                            "composed model"),
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-tau", "--tau", type=float, default=0.5,
                            help="fraction τ of each tensor's entries that are critical (official configs: CIFAR-10 "
                                 "0.5, CIFAR-100 0.4; PFLlib 1.0)")
        parser.add_argument("-bt", "--beta", type=float, default=100.0,
                            help="rounds β until clients collaborate on critical parameters only with themselves "
                                 "(official configs: CIFAR-10 100, CIFAR-100 170; PFLlib's 0 fails its own "
                                 "check)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.ala:
            raise FLError("-ala needs one global model to initialise from, but FedCAC starts each client from its "
                          "own composition of its collaborators' and the global model; drop -ala")
        if not 0 < cfg.tau <= 1 or cfg.beta <= 0:
            raise FLError(f"FedCAC needs 0 < -tau <= 1 and -bt > 0 (got -tau {cfg.tau}, -bt {cfg.beta}; "
                          f"the official configurations: -tau 0.5 -bt 100 on CIFAR-10, -tau 0.4 -bt 170 on CIFAR-100)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.composed: dict[int, dict] = {}  # the model each of the last round's uploaders starts from

    def broadcast(self, client):
        own = self.composed.get(client.id)
        return ("global", self.global_model) if own is None else ("own", own)

    def aggregate(self, uploads) -> None:
        super().aggregate(uploads)
        if not uploads:
            return
        names = [k for k, _ in self.global_model.named_parameters()]
        masks = torch.stack([torch.cat([u.extras["critical"][k].reshape(-1) for k in names]) for u in uploads])
        groups = collaborators(overlap_rates(masks), (self.round_idx + 1) / self.cfg.beta)
        glob = self.global_model.state_dict()
        self.composed = {}
        for u, group in zip(uploads, groups):
            state = {}
            for k in names:
                mean = sum(uploads[j].state[k].to(self.device) for j in group) / len(group)
                state[k] = torch.where(u.extras["critical"][k].to(self.device), mean, glob[k])
            state.update({k: v for k, v in glob.items() if k not in state})  # buffers: the global ones
            self.composed[u.id] = state
