"""FedFomo: Personalized Federated Learning with First Order Model Optimization.
Zhang, Sapra, Fidler, Yeung, Alvarez. ICLR 2021. https://arxiv.org/abs/2012.08565
Official code: https://github.com/NVlabs/FedFomo

Relative to FedAvg there is no global model. The server keeps each client's last uploaded model; a
participant i downloads M of them, chosen ε-greedily by its own affinity to each client, scores them on a
validation split of its training data and moves toward the ones that lower its loss,

    w_n = max(0, (L_i(θ_i) - L_i(θ_n)) / ||θ_n - θ_i||),  normalised;   θ_i ← θ_i + Σ_n w_n (θ_n - θ_i),

then trains θ_i locally and uploads it. Its affinity to n, which ranks the neighbours it asks for, changes
by n's unclipped score s_n = (L_i(θ_i) - L_i(θ_n)) / ||θ_n - θ_i|| over |Σ_m s_m| (the official code's
update), so a neighbour that raises the loss loses affinity instead of only gaining none. When no
neighbour helps, θ_i is kept. With ``-ala`` the FedFomo aggregate plays the global model's part: ALA
initialises θ_i from it. With ``-dp`` local training is DP-SGD (at q = -lbs / the samples left for training), but the validation
scoring is not privatised (``dp_support.uncovered``: a warning at start-up).

Flags: ``-M`` models each participant downloads = 5 (PFLlib's default; the official code's default is 8),
``--val_ratio`` 0.2 (official code: 20 % of the local data; the library's one validation holdout, which
FedFomo requires and which every algorithm can take), ``--epsilon`` 0.3 and ``--epsilon_decay``
0.05 per round (official code). The FedALA paper's comparison runs FedFomo with M = 20 (pass ``-M 20``):
with its 20 clients each one downloads every other client's model (here ``-M`` is capped at the clients
with a stored upload other than itself, at most N - 1).

Where PFLlib differs: its server picks the top-M clients of an affinity matrix without ε-greedy
exploration (the client's own id among the candidates), adds the scores s_n to the affinity without
normalising them (their scale drifts with the losses and the model distances) and holds out the last
20 % of the training file (here: a random 20 % from the client's own stream).
"""
from flcore.clients.clientfomo import FedFomoClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedFomoServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhang et al., ICLR 2021, [arXiv 2012.08565](https://arxiv.org/abs/2012.08565)",
        family="pFL, first-order weighting of downloaded client models",
        flags="`-M` 5, `--val_ratio` 0.2, `--epsilon` 0.3, `--epsilon_decay` 0.05",
        ala="yes: the client's model, from its FedFomo aggregate")
    declares = Declares(
        client_class=FedFomoClient,
        averaging_refusal="each client weighs its neighbours' models itself; the server averages none",
        pfllib_defaults={"M": 5},
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="a client builds its model from the neighbours its own affinities choose, which a client "
                              "that never trained does not have",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal=("each client builds its own weighted model from the models it downloads, not one mean of "
                            "updates"),
            uncovered=("FedFomo's scoring of the neighbours' models on the validation split (--val_ratio of the "
                       "training data, never passed through DP-SGD)"),
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-M", "--M", type=int, default=5,
                            help="models each participant downloads (PFLlib: 5; official code: 8)")
        # the general --val_ratio holdout (main.py) is the split FedFomo scores models on; official code: 0.2
        parser.set_defaults(val_ratio=0.2)
        parser.add_argument("--epsilon", type=float, default=0.3,
                            help="initial ε of the ε-greedy neighbour choice (official code: 0.3)")
        parser.add_argument("--epsilon_decay", type=float, default=0.05,
                            help="ε decreases by this much every round (official code: 0.05)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.M < 1 or not cfg.val_ratio > 0 or not 0 <= cfg.epsilon <= 1 or cfg.epsilon_decay < 0:
            raise FLError("FedFomo needs -M >= 1, --val_ratio > 0, 0 <= --epsilon <= 1, --epsilon_decay >= 0")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.client_states: dict[int, dict] = {}  # each client's last upload
        self.asked: dict[int, list[int]] = {}  # this round's requests: participant id -> neighbour ids

    def prepare_broadcast(self, participants) -> None:
        """Each participant names the neighbours it wants (its own ε-greedy choice)."""
        asked = self.call_each("choose_neighbours", [
            (c, (self.round_idx, [j for j in self.client_states if j != c.id])) for c in participants])
        self.asked = {c.id: ids for c, ids in zip(participants, asked)}

    def broadcast(self, client) -> dict | None:
        """A participant gets the models it asked for; the others get nothing."""
        if client.id not in self.asked:
            return None
        return {j: self.client_states[j] for j in self.asked[client.id]}

    def aggregate(self, uploads) -> None:
        for u in uploads:
            self.client_states[u.id] = {k: v.detach().clone() for k, v in u.state.items()}
