"""PartialFed (adaptive): Cross-Domain Personalized Federated Learning via Partial Initialization.
Sun, Huo, Yang, Bai. NeurIPS 2021. https://openreview.net/forum?id=lgDP84byd5
Official code: none located; PFLlib's current tree has no port (an earlier commit had clientpartial.py).

Relative to FedAvg this changes only the client's initialisation: instead of loading the whole global
model Θ, client i loads, layer by layer, either Θ's layer or keeps its own previous one,

    Θ̂_i[l] = Θ[l] if s_il = global else Θ_i[l],

with the choice s_il learned per client (PartialFed-Adaptive). Here each layer has two logits (global,
local); before training, a participant samples hard per-layer choices with the straight-through
Gumbel-softmax at temperature τ, mixes Θ and Θ_i accordingly, and updates the logits by SGD on the training
loss over ``--strategy_percent`` of an epoch's batches; the layer then takes the argmax choice. τ decays by
``--tau_decay`` per participation. Training, upload and aggregation are FedAvg's. A layer is
``layer_groups``' (weight and bias together, a residual block as one; BatchNorm statistics follow their
layer); the model being evaluated is the trained local model. With ``-ala`` the partially initialised model
plays the global model's part and ALA blends it into Θ_i.

Flags (this library's choices where the paper gives none): ``--tau`` 5.0 and ``--tau_decay`` 0.965 (the
values of that earlier PFLlib port), ``--strategy_lr`` 1.0,
``--strategy_percent`` 0.2.

Where that PFLlib port differs: it chooses per parameter tensor (weight and bias separately),
re-mixes the model with Θ at every batch of local training, and learns the strategy on the last part of
each epoch's batches with a clamped first-order step.
"""
from flcore.clients.clientpartial import PartialFedClient
from flcore.servers.serverbase import Server
from utils.errors import FLError


class PartialFedServer(Server):
    client_class = PartialFedClient

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--tau", type=float, default=5.0, help="initial Gumbel-softmax temperature")
        parser.add_argument("--tau_decay", type=float, default=0.965, help="τ factor per participation")
        parser.add_argument("--strategy_lr", type=float, default=1.0, help="SGD rate of the per-layer logits")
        parser.add_argument("--strategy_percent", type=float, default=0.2,
                            help="share of one epoch's batches spent learning the choice each round")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.tau <= 0 or not 0 < cfg.tau_decay <= 1 or cfg.strategy_lr < 0 or not 0 <= cfg.strategy_percent <= 1:
            raise FLError("PartialFed needs --tau > 0, 0 < --tau_decay <= 1, --strategy_lr >= 0 and "
                          "0 <= --strategy_percent <= 1")
