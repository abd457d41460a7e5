"""FedPer: Federated Learning with Personalization Layers.
Arivazhagan, Aggarwal, Singh, Choudhary. arXiv 2019. https://arxiv.org/abs/1912.00818

Relative to FedAvg this changes what is shared. The model is cut into base layers W_B (``base``) and
personalization layers W_P (``head``, the classifier; ``flcore.trainmodel.parts.split_head``). Each round
client i takes the global base under its own head, runs FedAvg's ``-ls`` epochs of SGD on the whole model
(base and head together, as in the paper's Algorithm 1), and uploads only the base:

    (W_B,i, W_P,i) ← SGD^{ls}((W_B, W_P,i); D_i),   W_B ← Σ_i (n_i / Σ_j n_j) W_B,i.

Heads never leave the clients (``personal_keys = ("head.",)``); each client is evaluated on its own base +
head. The paper's personalization layers are its top K_P layers; here, as in PFLlib, they are the
classifier ``fc`` (K_P = 1). With ``-ala`` the base is initialised by ALA from the global base, under
the client's own head (the top ``-p`` layers of the base are adapted). With ``-dp`` the whole local
training is DP-SGD (the base training loop). No flags of its own.
"""
from flcore.clients.clientper import FedPerClient
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares


class FedPerServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Arivazhagan et al., 2019, [arXiv 1912.00818](https://arxiv.org/abs/1912.00818)",
        family="pFL, shared base + local head (the whole model trains locally; only `base.*` is averaged)",
        flags="—",
        ala="yes: the base, its top adapted under the local head")
    declares = Declares(
        client_class=FedPerClient,
    )
