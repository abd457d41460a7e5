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

``PartSharingServer`` is the family's server: a split model whose shared parts are averaged by name.
"""
from torch import nn

from flcore.clients.clientper import FedPerClient
from flcore.servers.serverbase import Server
from flcore.trainmodel.parts import split_head
from utils.aggregate import weighted_average


class PartSharingServer(Server):
    """A split model (``base.*``, ``head.*``); only the shared parts (the client class's ``shared``) go down,
    and the uploads carry only the shared entries, by name."""

    checkpoint_skip = Server.checkpoint_skip + ("shared_part",)  # a view of the global model, rebuilt every broadcast

    def build_model(self):
        return split_head(super().build_model())

    def prepare_broadcast(self, participants) -> None:
        # The shared parts of the global model, the one payload every client receives (and what is counted):
        # the server's copy of a personal part is never sent.
        self.shared_part = nn.ModuleDict({name: getattr(self.global_model, name) for name in self.client_class.shared})

    def broadcast(self, client):
        return self.shared_part

    def aggregate(self, uploads) -> None:
        """Sample-weighted mean of the uploaded entries; the others keep their values (never used)."""
        if uploads:
            avg = weighted_average([u.state for u in uploads], [u.weight for u in uploads])
            self.load_aggregate(self.global_model, {**self.global_model.state_dict(), **avg})


class FedPerServer(PartSharingServer):
    client_class = FedPerClient
