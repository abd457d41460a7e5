"""FedCross: Towards Accurate Federated Learning via Multi-Model Cross-Aggregation.
Hu, Zhou, Yue, Ling, Huang, Li, Liu, Lian, Chen. ICDE 2024. https://arxiv.org/abs/2210.08285

Relative to FedAvg the server keeps K middleware models w_1..w_K instead of one global model, K = the
clients per round (int(-jr * N)), all starting from the common initial model. Each round (t = 0, 1, ...):

1. dispatch: the K middleware models go one-to-one to the K selected clients, in an order drawn from the
   server's own stream (so every middleware model meets different clients over the rounds);
2. each client trains its middleware model with plain local SGD (FedAvg's local update) and uploads v_i;
3. cross-aggregation: each uploaded v_i is fused with one collaborator v_co(i) chosen among the round's
   K models,
       w_i ← α v_i + (1 - α) v_co(i),
   all at once from the models as uploaded;
4. the global model, used for evaluation and deployment, is their uniform mean w_glb = (1/K) Σ_i w_i.

Collaborator selection ``-cmss`` (PFLlib's numbering), similarity = cosine of the flattened parameters:
  0  in order: co(i) = (i + (t mod (K - 1)) + 1) mod K, so over K - 1 rounds each model meets every other;
  1  lowest similarity: co(i) = argmin_{j≠i} cos(v_i, v_j);
  2  highest similarity: co(i) = argmax_{j≠i} cos(v_i, v_j).
A slot whose client dropped out (``-cdr``) or missed the deadline (``-tth``) uploads nothing: its
middleware model is kept as it was (and still serves as a collaborator, as the server's current model of
that slot). The client evaluates the global model (traditional FL) and trains from its middleware model;
with ``-ala``, ALA initialises that training start from the client's last trained model and its
middleware model (the middleware model plays ALA's "global model"). ``-dp`` privatises the local SGD.

Flags (PFLlib's names):
  ``-ca`` / ``--fedcross_alpha`` α = 0.99 (the paper's and PFLlib's default);
  ``-cmss`` / ``--collaborative_model_select_strategy`` = 1, lowest similarity (PFLlib's default;
  PFLlib's misspelt long name ``--collaberative_model_select_strategy`` is accepted too);
  ``-fsb`` / ``--first_stage_bound`` = 0: rounds t < fsb are a FedAvg first stage, every middleware model
  ← the sample-weighted mean of the uploads (PFLlib's option, the two-stage scheme of the same authors'
  FedMR; 0 = the paper's FedCross from the first round). The paper's own acceleration methods (propeller
  models, dynamic α) are not implemented.

Where PFLlib differs: inside its round loop the client index shadows the round index, so the first-stage
test and the in-order offset use the last client's index instead of the round (fixed here); its
similarity sums cosines over pairs of consecutive state entries (buffers included) rather than over the
whole parameter vector; its highest-similarity choice may pick the model itself; its global model is the
sample-weighted FedAvg of the uploads before cross-aggregation rather than the mean of the middleware
models; its cross-aggregation mixes parameters only (BatchNorm statistics come from whichever of the two
models has the lower slot index); it stores every selected client's trained model as a middleware model
whether or not the client dropped out; and ``-rjr`` overruns its K middleware models (refused here).

Verified at CPU scale (4-layer CNN, sklearn Digits, -lr 0.1, -lbs 10, 1 local epoch, seed 0): on 5 IID
clients the global model reaches 0.85 after 5 rounds (FedAvg 0.90) and 0.98 after 30 (FedAvg 0.98); on 6
pathological clients (2 labels each) the K models, each trained on two labels per round and mixed at 1 %,
average badly at first (0.10 after 5 rounds, FedAvg 0.62) and catch up slowly (0.82 after 30 rounds,
FedAvg 0.86; with ``-fsb 5``, 0.84 after 29).
"""
import copy

import torch

from flcore.clients.clientcross import FedCrossClient
from flcore.servers.serverbase import Declares, Server
from utils.aggregate import weighted_average
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.personal_aggregation import flat
from utils.seeding import np_rng
from utils.selection import join_count

STRATEGIES = {0: "in order", 1: "lowest similarity", 2: "highest similarity"}


def cosine_matrix(states, keys) -> torch.Tensor:
    """K x K matrix of cos(v_i, v_j) over the entries ``keys`` (float64; a zero vector counts as orthogonal)."""
    w = torch.stack([flat(s, keys) for s in states])
    w = w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return w @ w.T


def choose_collaborators(strategy: int, round_idx: int, sims: torch.Tensor | None, k: int) -> list[int]:
    """co(i) for every middleware slot i (see the module docstring); a single model is its own partner.
    ``sims`` (K x K cosines) is needed by strategies 1 and 2 only; ties go to the lowest index."""
    if k == 1:
        return [0]
    if strategy == 0:
        offset = round_idx % (k - 1) + 1
        return [(i + offset) % k for i in range(k)]
    masked = sims.clone()
    masked.fill_diagonal_(float("inf") if strategy == 1 else float("-inf"))
    pick = masked.argmin(dim=1) if strategy == 1 else masked.argmax(dim=1)
    return [int(j) for j in pick]


def cross_aggregate(states, partners, alpha: float) -> list[dict]:
    """w_i = α v_i + (1 - α) v_partners[i] over every entry (integer entries: the rounded mix)."""
    return [weighted_average([states[i], states[j]], [alpha, 1.0 - alpha]) for i, j in enumerate(partners)]


class FedCrossServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Hu et al., ICDE 2024, [arXiv 2210.08285](https://arxiv.org/abs/2210.08285)",
        family=("traditional FL, K = jr·N middleware models sent one-to-one to the selected clients in random "
                "order; each upload mixed with one collaborator, w_i ← α v_i + (1 − α) v_co; the global model "
                "(evaluated) is their mean; slots without an upload keep their model; `-rjr` refused"),
        flags=("`-ca` α 0.99, `-cmss` 1 (0 in order, 1 lowest, 2 highest cosine similarity), `-fsb` 0 (rounds of "
               "FedAvg first)"),
        ala="yes: ALA blends the client's last trained model with its middleware model")
    declares = Declares(
        client_class=FedCrossClient,
        averaging_refusal="its middleware models are pairwise mixes, not one average",
        pfllib_defaults={"first_stage_bound": 0, "fedcross_alpha": 0.99, "collaborative_model_select_strategy": 1},
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal="each client receives a different middleware model, not one mean of updates",
        ),
        personalized=False,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-fsb", "--first_stage_bound", type=int, default=0,
                            help="rounds t < fsb aggregate by FedAvg (every middleware model <- the mean of the "
                                 "uploads); 0 = cross-aggregation from the first round (PFLlib's default)")
        parser.add_argument("-ca", "--fedcross_alpha", type=float, default=0.99,
                            help="α in w_i <- α v_i + (1 - α) v_co (paper and PFLlib: 0.99)")
        parser.add_argument("-cmss", "--collaborative_model_select_strategy", "--collaberative_model_select_strategy",
                            dest="collaborative_model_select_strategy", type=int, default=1, choices=sorted(STRATEGIES),
                            help="collaborator choice: 0 in order, 1 lowest cosine similarity, 2 highest "
                                 "(PFLlib's numbering; PFLlib: 1)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if not 0.0 <= cfg.fedcross_alpha <= 1.0:
            raise FLError(f"-ca must be in [0, 1] (got {cfg.fedcross_alpha})")
        if cfg.first_stage_bound < 0:
            raise FLError(f"-fsb must be >= 0 (got {cfg.first_stage_bound})")
        if cfg.random_join_ratio:
            raise FLError("FedCross keeps K = int(-jr * N) middleware models, one per selected client; -rjr changes "
                          "the count each round: drop -rjr")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = join_count(self.cfg.join_ratio, len(self.clients))
        init = {n: v.detach().clone() for n, v in self.global_model.state_dict().items()}
        self.middleware = [{n: v.clone() for n, v in init.items()} for _ in range(self.k)]
        self.param_keys = [n for n, _ in self.global_model.named_parameters()]
        self.dispatch_rng = np_rng(self.cfg.seed, self.run, "fedcross-dispatch")
        self.slot_of: dict[int, int] = {}  # client id -> middleware slot, for this round's participants
        self.partners: list[int] = []  # co(i) of the last cross-aggregation

    def prepare_broadcast(self, participants) -> None:
        """The round's one-to-one dispatch: slot i goes to participant order[i], a fresh random order."""
        if len(participants) > self.k:
            raise FLError(f"FedCross has {self.k} middleware models but {len(participants)} participants")
        order = self.dispatch_rng.permutation(len(participants))
        self.slot_of = {participants[int(j)].id: i for i, j in enumerate(order)}

    def broadcast(self, client):
        """Every client gets the global model (what it is evaluated on); a participant also gets the
        middleware model of its slot (what it trains)."""
        payload = {"global": self.global_model}
        slot = self.slot_of.get(client.id)
        if slot is not None:
            model = copy.deepcopy(self.global_model)
            model.load_state_dict(self.middleware[slot])
            payload["middleware"] = model
        return payload

    def aggregate(self, uploads) -> None:
        """Cross-aggregation of the uploaded slots (FedAvg in the first stage); the global model becomes
        the mean of the middleware models."""
        if not uploads:
            return
        models = list(self.middleware)
        for u in uploads:
            models[self.slot_of[u.id]] = {n: v.detach().clone() for n, v in u.state.items()}
        if self.round_idx < self.cfg.first_stage_bound:
            avg = weighted_average([u.state for u in uploads], [u.weight for u in uploads])
            self.middleware = [{n: v.clone() for n, v in avg.items()} for _ in range(self.k)]
        else:
            sims = None if self.cfg.collaborative_model_select_strategy == 0 else cosine_matrix(models, self.param_keys)
            self.partners = choose_collaborators(self.cfg.collaborative_model_select_strategy, self.round_idx, sims,
                                                 self.k)
            mixed = cross_aggregate(models, self.partners, self.cfg.fedcross_alpha)
            uploaded = {self.slot_of[u.id] for u in uploads}
            self.middleware = [mixed[i] if i in uploaded else models[i] for i in range(self.k)]
        self.load_aggregate(self.global_model, weighted_average(self.middleware, [1.0] * self.k))
