"""PartialFed (adaptive): Cross-Domain Personalized Federated Learning via Partial Initialization.
Sun, Huo, Yang, Bai. NeurIPS 2021. https://openreview.net/forum?id=lgDP84byd5
Official code: none located; PFLlib's current tree has no port (an earlier commit had clientpartial.py).

Relative to FedAvg this changes only the client's initialisation: instead of loading the whole global
model Θ, client i loads, layer by layer, either Θ's layer or keeps its own previous one,

    Θ̂_i[l] = Θ[l] if s_il = global else Θ_i[l],

with the choice s_il learned per client (PartialFed-Adaptive). Training, upload and aggregation are
FedAvg's.

How the choice is learned. Each layer has two logits (global, local), starting at the prior
P(global) = ``--strategy_prior``. Each local update leaves a fresh random slice of ``--strategy_percent``
of the client's training samples out (drawn from the client's own stream) and trains ``-ls`` epochs on
the rest. At the client's next round, before composing, it makes one pass over that slice in batches of
``-lbs``: per batch, hard per-layer choices sampled by the straight-through Gumbel-softmax at temperature
τ compose Θ and Θ_i, and the logits take one SGD step of ``--strategy_lr`` on that model's loss. Each
layer then takes the argmax choice (ties load Θ's). τ = ``--tau`` decays by ``--tau_decay`` per
participation.

Why a held-out slice: scored on samples Θ_i has just fitted, "keep local" wins in every layer, Θ becomes
an average of diverging local models and PartialFed turns into Local (so it did in the earlier version
of this file: share of layers loaded from Θ 0.0 from round 2, accuracy within 0.005 of Local's on
20-client IID Digits at the default -lr). Neither Θ_i nor Θ trained on the slice in its last update, so
the comparison says which layer does better on the client's own distribution: on an IID split Θ's layers
win (Θ has seen N times the data), on a pathological one the upper layers stay local. Why the prior: the
straight-through gradient is a first-order estimate at the sampled composition; where both sides do
about as well (IID) it is noise around zero, and the prior keeps FedAvg's full loading until the data
consistently says otherwise; ``--strategy_lr`` 50 lets such a signal cross it within a few rounds (the
logits' gradient carries the relaxation's factor p(1 - p) / τ, about 0.05 at τ = 5). Cost: one forward and
backward pass over the slice in place of training on it, so a round costs about FedAvg's (1.2-1.4x on
20-client Digits, the small passes' overhead); on IID data the slice left out of each update costs some
accuracy early on (below).

A layer is ``layer_groups``' (weight and bias together; a normalisation layer joins the layer below it,
its statistics following the choice; a ResNet stage is one layer). The model evaluated is the composed
model (evaluation follows the broadcast, as in PFLlib). Clients that do not take part in a round compose
with their current choice without learning. With ``-ala`` the composed model plays the global model's
part and ALA blends it into Θ_i (ALA samples the whole training split). With ``-dp`` the choice is learned
without noise: its use of the held-out samples is not in the privacy accounting. Each evaluation records
``global_layer_share`` (over clients, the share of layers loaded from Θ) and
``global_layer_share_by_layer`` (per layer, bottom to top).

Flags (this library's choices where the paper gives none): ``--tau`` 5.0 and ``--tau_decay`` 0.965 (the
values of that earlier PFLlib port), ``--strategy_lr`` 50, ``--strategy_percent`` 0.2 (0: no learning, the
prior's argmax applies), ``--strategy_prior`` 0.9.

Where the paper differs: it selects layers at batch level during local training, learning the strategy
jointly with the weights on the training batches. Here the strategy is learned at the start of the
round, on samples the local model has not just trained on, and the local update then trains one composed
model as FedAvg does; scoring the choice on the training batches is what made it collapse to "local".

Where that PFLlib port differs: it chooses per parameter tensor (weight and bias separately), re-mixes
the model with Θ at every batch of local training, and learns the strategy on the last part of each
epoch's batches with a clamped first-order step.

Measured (Digits, 20 clients, -lr 0.1, -lbs 10, seed 0; share = layers loaded from Θ). 15 rounds: IID
share 0.99-1.0 every round, accuracy 0.874 (FedAvg 0.923, Local 0.756); pathological (2 classes a client)
share 0.56 after round 1 and 0.39 by round 13 (conv1 from Θ, conv2 and the classifier local), accuracy
0.976 (FedAvg 0.780, Local 0.987). 100 rounds: IID 0.984 (FedAvg 0.989, Local 0.849; share 0.93),
pathological 0.991 (FedAvg 0.969, Local 0.989; share 0.39). 10 rounds at -lr 0.05 (IID, balanced,
split seed 0): 0.713 (FedAvg 0.731, Local 0.327) with share 1.0 in every round, i.e. the strategy takes
the global model; with ``--strategy_percent 0`` (nothing held out, the prior loads every layer from Θ:
FedAvg's model with PartialFed's batch order) 0.747, so the gap to FedAvg is the held-out slice and
batch-order noise of that size, not the strategy.
"""
import numpy as np

from flcore.clients.clientpartial import PartialFedClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import DPSupport
from utils.errors import FLError


class PartialFedServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Sun et al., NeurIPS 2021, [OpenReview](https://openreview.net/forum?id=lgDP84byd5)",
        family=("pFL, learned per-layer partial initialisation (adaptive; the choice is scored on a slice of the "
                "training data each update leaves out)"),
        flags=("`--tau` 5, `--tau_decay` 0.965, `--strategy_lr` 50, `--strategy_percent` 0.2, `--strategy_prior` "
               "0.9"),
        ala="yes: the local model, from the partially initialised model")
    declares = Declares(
        client_class=PartialFedClient,
        pfllib_defaults={"tau": 1.0},
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            uncovered="PartialFed's strategy step (per-layer choice learned on the held-out slice without noise)",
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("--tau", type=float, default=5.0, help="initial Gumbel-softmax temperature")
        parser.add_argument("--tau_decay", type=float, default=0.965, help="τ factor per participation")
        parser.add_argument("--strategy_lr", type=float, default=50.0, help="SGD rate of the per-layer logits")
        parser.add_argument("--strategy_percent", type=float, default=0.2,
                            help="share of the training samples each local update leaves out to score the "
                                 "choice on at the next round (0: no learning)")
        parser.add_argument("--strategy_prior", type=float, default=0.9,
                            help="initial probability that a layer loads the global model's")

    @classmethod
    def check_config(cls, cfg) -> None:
        if (cfg.tau <= 0 or not 0 < cfg.tau_decay <= 1 or cfg.strategy_lr < 0
                or not 0 <= cfg.strategy_percent < 1 or not 0 < cfg.strategy_prior < 1):
            raise FLError("PartialFed needs --tau > 0, 0 < --tau_decay <= 1, --strategy_lr >= 0, "
                          "0 <= --strategy_percent < 1 and 0 < --strategy_prior < 1")

    def extra_metrics(self) -> dict:
        """The clients' current choices: the mean share of layers loaded from the global model, overall
        and per layer (bottom to top)."""
        choices = np.array(self.call_clients(self.clients, "from_global"), dtype=np.float64)
        return {"global_layer_share": float(choices.mean()), "global_layer_share_by_layer": choices.mean(0)}
