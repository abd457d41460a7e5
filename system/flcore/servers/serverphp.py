"""FedPHP: Federated Personalization with Inherited Private Models.
Li, Zhan, Shao, Li, Song. ECML-PKDD 2021. https://doi.org/10.1007/978-3-030-86486-6_36 (no arXiv version)
Official code: https://github.com/lxcnju/FedRepo (algorithms/fedphp.py)

Relative to FedAvg this changes the client. Each client keeps an inherited private model (HPM) v_i, a
temporal ensemble of its past local models. The received global model w (ALA-initialised with ``-ala``)
is trained with the HPM as teacher,

    L = (1 - λ) CE(w(x), y) + λ KD(w(x) ‖ v_i(x)),   KD = cross-entropy to softmax(v_i(x) / T),

and afterwards the HPM inherits it: v_i ← μ_τ v_i + (1 - μ_τ) w, where μ_τ = min(μ τ / (ρ R), μ) grows
linearly with τ, the client's number of earlier participations (ρ R expected ones in R rounds). w is
uploaded and averaged as in FedAvg; the HPM v_i is the personalised model that is evaluated.

Flags (official code's settings): ``-mu`` μ = 0.9 (ceiling of the momentum), ``-lam`` λ = 0.05 (the KD
setting), ``--kd_temperature`` T = 4 (applied to the teacher only, as the official code does).
The paper's MMD variant of the knowledge transfer is not implemented.

Where PFLlib differs (its FedPHP since December 2024): it too trains the received w and then folds it
into a private model, v_i ← μ_t v_i + (1 - μ_t) w, but μ_t = μ t / R grows with the round index t (not
with the client's participations); the knowledge transfer is an MMD loss between the features (``base``)
of w and of v_i, weighted λ against (1 - λ) for the cross-entropy, not distillation from v_i's outputs;
and it evaluates w after local training, never v_i (a client that did not train is evaluated on the
received global model). Its defaults ``-mu 0 -lam 1`` switch off both the inheritance (v_i is the last
trained w) and the cross-entropy term. Before December 2024 its private model was the model it trained:
each round started from (1 - μ_t) w + μ_t (its last trained model), was evaluated before training and
was trained with the MMD towards the received global model's features.
"""
from flcore.clients.clientphp import FedPHPClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


class FedPHPServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper=("Li et al., ECML-PKDD 2021, [doi "
               "10.1007/978-3-030-86486-6_36](https://doi.org/10.1007/978-3-030-86486-6_36)"),
        family="pFL, inherited private model + distillation",
        flags="`-mu` 0.9, `-lam` 0.05, `--kd_temperature` 4",
        ala="yes: the local copy of the global model (the private model inherits it after training)")
    declares = Declares(
        client_class=FedPHPClient,
        pfllib_defaults={"mu": 0.0, "lamda": 1.0},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-mu", "--mu", type=float, default=0.9,
                            help="ceiling of the HPM momentum μ, reached after the expected participations "
                                 "(official code: 0.9)")
        parser.add_argument("-lam", "--lamda", type=float, default=0.05,
                            help="weight λ of the distillation from the HPM (official code, KD: 0.05)")
        parser.add_argument("--kd_temperature", type=float, default=4.0,
                            help="temperature T of the HPM's soft targets (official code: 4)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if not 0 <= cfg.mu <= 1 or not 0 <= cfg.lamda <= 1 or cfg.kd_temperature <= 0:
            raise FLError("FedPHP needs 0 <= -mu <= 1, 0 <= -lam <= 1 and --kd_temperature > 0")
