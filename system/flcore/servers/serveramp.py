"""FedAMP: Personalized Cross-Silo Federated Learning on Non-IID Data.
Huang, Chu, Zhou, Wang, Liu, Pei, Zhang. AAAI 2021. https://arxiv.org/abs/2007.03797
Official code: no release located; reference port: PFLlib's serveramp.py (https://github.com/TsingZ0/PFLlib).

Relative to FedAvg this changes both sides. The server keeps every client's last uploaded model w_j and,
instead of one global model, sends each client i its own cloud model built by attentive message passing,

    u_i = Σ_j ξ_ij w_j,   ξ_ij = α_k exp(-||w_i - w_j||^2 / σ) / σ (j ≠ i),   ξ_ii = 1 - Σ_{j≠i} ξ_ij,

so similar clients share more. Client i starts from u_i (ALA initialises from it with ``-ala``) and trains
with the proximal term (λ / (2 α_k)) ||w - u_i||^2, then uploads w_i. The personalised model is the client's
own model.

Flags (PFLlib's names; the paper tunes the values per data set): ``-alk`` α_k = 0.005, ``-sg`` σ = 0.1,
``-lam`` λ = 5e-5. α_k / σ = 0.05 keeps every ξ_ii >= 0 (u_i a convex combination) for up to 21 clients;
λ / α_k = 0.01 is FedProx's default weight here. PFLlib's defaults (1, 1, 1) make ξ_ii strongly negative
whenever models are within about σ of each other (u_i then extrapolates away from the neighbours); a
warning says so when it happens. Distances use the parameters; the message passes every floating state
entry. Clients that have not uploaded yet count with the common initial model.

Where PFLlib differs: its proximal term is the non-squared norm ||w - u_i|| computed on detached tensors,
so it contributes no gradient (local training is then plain SGD); its clients never start from u_i (they
keep w_i) and its server mixes only the models uploaded in the last round.
"""
import copy
import sys

from flcore.clients.clientamp import FedAMPClient
from flcore.servers.serverbase import Server
from utils.errors import FLError
from utils.personal_aggregation import amp_attention, attentive_message, pairwise_sq_dists


class FedAMPServer(Server):
    client_class = FedAMPClient

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-alk", "--alphaK", type=float, default=0.005,
                            help="message-passing step α_k; keep α_k <= σ/(N-1) (PFLlib default 1.0)")
        parser.add_argument("-lam", "--lamda", type=float, default=5e-5,
                            help="attention regulariser weight λ; proximal weight is λ/α_k (PFLlib default 1.0)")
        parser.add_argument("-sg", "--sigma", type=float, default=0.1,
                            help="scale σ of A(x) = 1 - exp(-x/σ) (PFLlib default 1.0)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.alphaK <= 0 or cfg.sigma <= 0 or cfg.lamda < 0:
            raise FLError("FedAMP needs -alk > 0, -sg > 0 and -lam >= 0")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init = {k: v.detach().clone() for k, v in self.global_model.state_dict().items()}
        self.client_states = [init] * len(self.clients)  # w_j as last uploaded
        self.param_keys = [n for n, _ in self.global_model.named_parameters()]
        self.warned = False

    def attention(self):
        return amp_attention(pairwise_sq_dists(self.client_states, self.param_keys),
                             self.cfg.alphaK, self.cfg.sigma)

    def prepare_broadcast(self, participants) -> None:
        """The round's attention weights ξ, from the stored models."""
        self.xi = self.attention()
        if not self.warned and bool((self.xi.diagonal() < 0).any()):
            self.warned = True
            print(f"WARNING: FedAMP self-attention ξ_ii < 0 in round {self.round_idx}: cloud models extrapolate; "
                  f"lower -alk below -sg/(N-1) = {self.cfg.sigma / max(len(self.clients) - 1, 1):.3g}", file=sys.stderr)

    def broadcast(self, client):
        """Each client receives its own cloud model u_i."""
        cloud = copy.deepcopy(self.global_model)
        cloud.load_state_dict(attentive_message(self.client_states, self.xi[client.id], client.id))
        return cloud

    def aggregate(self, uploads) -> None:
        """No averaging: the uploaded w_i replace the stored ones."""
        for u in uploads:
            self.client_states[u.id] = {k: v.detach().clone() for k, v in u.state.items()}
