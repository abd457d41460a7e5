"""LG-FedAvg: Think Locally, Act Globally: Federated Learning with Local and Global Representations.
Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency. arXiv 2020 (NeurIPS 2019 FL
workshop). https://arxiv.org/abs/2001.01523   Official code: https://github.com/pliang279/LG-FedAvg

Relative to FedAvg this changes what is shared, the opposite split of FedPer: each client keeps its own
local representation (``base``) and shares the global classifier (``head``;
``flcore.trainmodel.parts.split_head``). Each round client i takes the global head on top of its own
base, runs FedAvg's ``-ls`` epochs of SGD on the whole model, and uploads only the head:

    (θ_i^l, θ_i^g) ← SGD^{ls}((θ_i^l, θ^g); D_i),   θ^g ← Σ_i (n_i / Σ_j n_j) θ_i^g.

Bases never leave the clients (``personal_keys = ("base.",)``). The paper's global part is the top
layers (in its MNIST/CIFAR experiments the last two or three fully connected layers); here, as in
PFLlib, it is the classifier ``fc``. The paper can also pre-train the whole model with FedAvg before the
split; like PFLlib, no pre-training is done here. With ``-ala`` the received head is initialised by ALA
under the client's own base (the head is one layer on the library's models: ``-p`` 1, the default, or 0;
larger values are refused).
With ``-dp`` the local training is DP-SGD (the base training loop). With ``--client_models`` each
client's base is its own architecture under the shared head (-fd x C). No flags of its own.
"""
from flcore.clients.clientlg import LGFedAvgClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.model_support import ModelSupport


class LGFedAvgServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Liang et al., 2020, [arXiv 2001.01523](https://arxiv.org/abs/2001.01523)",
        family="pFL, local base + shared head (only `head.*` is averaged)",
        flags="—",
        ala="yes: the head (at most its 2 tensors / 1 layer), adapted under the local base")
    declares = Declares(
        client_class=LGFedAvgClient,
        model_support=ModelSupport(  # --client_models: every client's base is its own architecture
            refusal="", shares="the classifier head (-fd x C), averaged", same_shape="head"),
    )
