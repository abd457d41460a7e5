"""FedKD: Communication-efficient federated learning via knowledge distillation.
Wu, Wu, Lyu, Qi, Huang, Xie. Nature Communications 13, 2032 (2022). https://arxiv.org/abs/2108.13323
Official code: https://github.com/wuch15/FedKD

Relative to FedAvg each client keeps a personal mentor model (the one evaluated, as in PFLlib) next to the
shared mentee (FedAvg's model), and a map W_h from the mentee's hidden state to the mentor's (the hidden
state here: the classifier's input, ``parts.head_of``). Both models learn from the labels and from each
other, the distillation weighted by how well they predict (mentor t, mentee s; one SGD step on both):

    L_t = CE_t + (KL(p_s || p_t) + MSE(H_t, W_h H_s)) / (CE_t + CE_s),
    L_s = CE_s + (KL(p_t || p_s) + MSE(H_t, W_h H_s)) / (CE_t + CE_s),

KL targets detached, the weight 1 / (CE_t + CE_s) taken as a constant. Only the mentee's update crosses
the wire, both ways, as truncated SVDs: each matrix Δ (a conv kernel as out x in*kh*kw) = U Σ V goes as
(U_k, σ_k, V_k) with the fewest k whose energy Σ_{i<=k} σ_i² reaches T(t) of Σ σ_i², where

    T(t) = T_start + (T_end - T_start) (t + 1) / R      (round t = 0 .. R-1, R = -gr),

rounds counted from 1 as in the official code (the paper's t / R for t = 1 .. R: the last round reaches
T_end); vectors (biases), and matrices whose factors would not be smaller, go dense. The server averages the
clients' reconstructed updates (sample-weighted, FedAvg), compresses the average at T(t) the same way,
applies it to the global mentee and sends the factors to every client, which applies them to its copy
of the global mentee and (re)starts its mentee from that copy (with ``-ala``: ALA onto the mentee).
``rs_bytes_up`` / ``rs_bytes_down`` count the factors.

Flags: ``-mlr`` mentee learning rate = -lr (the paper trains both models at one rate; PFLlib's default
0.005), ``-Ts`` T_start = 0.95 and ``-Te`` T_end = 0.98 (the paper's and PFLlib's). Without
``--client_models`` the mentor and the mentee share the architecture ``-m`` (as in PFLlib) and start from
the common initialisation; with it, as in the paper (a large personal mentor, a shared mentee), each
mentor is the client's own architecture and the mentee stays ``-m``. W_h (no bias, mentee width -> mentor
width) learns at -lr. ``-dp``: the joint step is DP-SGD (one clipped
per-sample gradient over mentor, mentee and W_h); the SVD only post-processes the private mentee.

Where PFLlib differs: it compresses the mentee's parameters, not its update; its rank search keeps
strictly more than T of the energy and drops every singular value of a matrix that needs them all; it
decomposes conv kernels as a batch of kh x kw matrices; its T(t) is Ts + (Te - Ts) t / R (round 0 at Ts,
T_end never reached); the adaptive weight carries gradient (lowering the distillation terms by raising
the task losses); W_h gets the hidden loss's gradient twice; it clips every gradient to norm 10 and
averages the clients with equal weights.

Verified (tests/test_fedkd.py): the kept energy and minimal rank, the reconstruction error = the dropped
σ², T(t) by hand, the upload = the factors at the round's T(t), the clients' global mentee equal to the
server's, the losses and each model's gradient by hand. Digits (sklearn's), 5 rounds at -lr 0.1, one
seed: 5 IID clients 0.856 (FedAvg 0.896), 6 clients with 2 classes each 0.982 (FedAvg 0.621); bytes up a
round 0.84-1.15 MB and down 0.64-0.89 MB for 5 clients (FedAvg: 3.78 MB each way).
"""
from flcore.clients.clientkd import FedKDClient, apply_update, compress_state, decompress, energy_threshold
from flcore.servers.serverbase import Declares, Server
from utils.aggregate import weighted_average
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport


class FedKDServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Wu et al., Nat. Commun. 2022, [arXiv 2108.13323](https://arxiv.org/abs/2108.13323)",
        family=("pFL KD: personal mentor (evaluated) + shared mentee, CE + (KL + MSE(H_t, W_h H_s)) / (CE_t + "
                "CE_s); mentee updates go up and down as truncated SVDs keeping energy T(t) = Ts + (Te − Ts) (t + "
                "1) / R"),
        flags="`-mlr` = -lr, `-Ts` 0.95, `-Te` 0.98",
        ala="yes: the mentee")
    declares = Declares(
        client_class=FedKDClient,
        averaging_refusal="its server averages compressed updates of a mentee, not models",
        # -nnc is refused (cli.py, from this field): why
        new_client_refusal="the server sends updates that each client applies to the global mentee it rebuilt from "
                              "every download since round 0",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            client_refusal="its clients upload SVD factors of the update, not the model entries the release clips",
        ),
        model_support=ModelSupport(  # --client_models: the paper's large personal mentor beside a shared mentee
            refusal="", shares="the mentee's update (-m on every client), SVD-compressed", same_shape="logits",
            personal=True),
    )


    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-mlr", "--mentee_learning_rate", type=float, default=None,
                            help="mentee learning rate (default: -lr, one rate as in the paper; PFLlib: 0.005)")
        parser.add_argument("-Ts", "--T_start", type=float, default=0.95,
                            help="SVD energy threshold's start T_start (paper and PFLlib: 0.95)")
        parser.add_argument("-Te", "--T_end", type=float, default=0.98,
                            help="SVD energy threshold's end: T(t) = Ts + (Te - Ts) (t + 1) / R in round t = 0 .. R-1 "
                                 "(paper and PFLlib: 0.98)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if not 0 < cfg.T_start <= cfg.T_end <= 1:
            raise FLError(f"FedKD needs 0 < -Ts <= -Te <= 1 (got {cfg.T_start}, {cfg.T_end})")
        if cfg.mentee_learning_rate is not None and cfg.mentee_learning_rate <= 0:
            raise FLError(f"FedKD needs -mlr > 0 (got {cfg.mentee_learning_rate})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending: dict = {}  # the compressed global update not yet sent (empty before round 1)
        self.outgoing: dict = {"update": {}}  # the payload of the broadcast under way

    def prepare_broadcast(self, participants) -> None:
        """The pending update goes out with this broadcast (every client applies it to its global mentee),
        so the next broadcast starts from an empty one."""
        self.outgoing, self.pending = {"update": self.pending}, {}

    def broadcast(self, client) -> dict:
        return self.outgoing

    def aggregate(self, uploads) -> None:
        if not uploads:
            return
        state = self.global_model.state_dict()
        updates = [{k: decompress(e, state[k].shape) for k, e in u.extras["update"].items()} for u in uploads]
        mean = weighted_average(updates, [u.weight for u in uploads])
        energy = energy_threshold(self.cfg.T_start, self.cfg.T_end, self.round_idx, self.cfg.global_rounds)
        self.pending = compress_state(mean, energy)
        apply_update(self.global_model, self.pending)
