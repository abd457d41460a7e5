"""FML: Federated Mutual Learning.
Shen, Zhang, Zheng, Wang, Yang, Wu, Lin. arXiv 2020. https://arxiv.org/abs/2006.16765

Relative to FedAvg each client keeps a private local model θ_i (the one evaluated, PFLlib's choice too;
its own random initialisation, as the paper's local models may even differ in architecture) next to the
shared "meme" model w, which it receives, trains and uploads as FedAvg does its model. The two
learn from each other by deep mutual learning, one SGD step on both per batch:

    L_local = α CE(θ_i) + (1 - α) KL(p_w || p_θ),      L_meme = β CE(w) + (1 - β) KL(p_θ || p_w),

each KL target being the other model's (detached) prediction. The server averages the meme models,
weighted by training samples (FedAvg). With ``-ala`` ALA initialises the meme model from the global one.
With ``--client_models`` the local models are the clients' own architectures (the paper's heterogeneous
local models) and the meme model stays ``-m`` on every client.
With ``-dp`` the joint step on both models is DP-SGD (one clipped per-sample gradient over both).

Flags: ``-al`` α = 0.5 and ``-bt`` β = 0.5 (the paper's setting). PFLlib's defaults ``-al 1 -bt 0``
make the local model plain CE training and the meme model pure distillation (no label loss at all).

Where PFLlib differs: its KL targets are not detached, so the local model's loss also trains the meme
model; its ``KLDivLoss()`` averages over batch x classes (1/C of the KL); it clips both models' gradients
to norm 10, averages the memes with equal weights and starts the local model from the common
initialisation (with α = β the two models would then stay equal through a client's first round).

Verified (tests/test_fml.py): the losses and their gradients by hand, both KL weights 0 = two independent
CE trainings, the meme FedAvg-averaged and the local model never uploaded. Digits (sklearn's), -lr 0.1,
one seed: 6 clients with 2 classes each, 5 rounds: 0.882 (best 0.989; FedAvg 0.621); 5 IID clients:
0.684 after 5 rounds (FedAvg 0.896; the local model's label loss has weight α = 0.5), 0.913 after 10;
with ``-al 1 -bt 1`` 0.836 after 5.
"""
from flcore.clients.clientfml import FMLClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError
from utils.model_support import ModelSupport


class FMLServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Shen et al., 2020, [arXiv 2006.16765](https://arxiv.org/abs/2006.16765)",
        family=("pFL KD: local model (evaluated, own initialisation) α CE + (1−α) KL(p_meme‖p_local); meme model "
                "β CE + (1−β) KL(p_local‖p_meme), targets detached; the meme model is FedAvg-averaged"),
        flags="`-al` α 0.5, `-bt` β 0.5",
        ala="yes: the meme model")
    declares = Declares(
        client_class=FMLClient,
        model_support=ModelSupport(  # --client_models: the paper's heterogeneous local models
            refusal="", shares="the meme model (-m on every client), averaged", same_shape="logits", personal=True),
        pfllib_defaults={"alpha": 1.0, "beta": 0.0},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.add_argument("-al", "--alpha", type=float, default=0.5,
                            help="α, local model's CE weight; 1-α on KL toward the meme (paper: 0.5)")
        parser.add_argument("-bt", "--beta", type=float, default=0.5,
                            help="β, meme model's CE weight; 1-β on KL toward the local model (paper: 0.5)")

    @classmethod
    def check_config(cls, cfg) -> None:
        if not (0 <= cfg.alpha <= 1 and 0 <= cfg.beta <= 1):
            raise FLError(f"FML needs 0 <= -al <= 1 and 0 <= -bt <= 1 (got {cfg.alpha}, {cfg.beta})")
