"""The model-splitting family's server: a split model (``base.*``, ``head.*``; ``flcore.trainmodel.parts.
split_head``) whose shared parts (the client class's ``shared``, clients/partsharing.py) go down to every
client and come back by name, averaged weighted by sample count. FedPer, FedRep, LG-FedAvg, FedRoD, FedBABU,
FedCP, GPFL, FedDBE, FedGC, FedGH, FedAS and PFL-DA build on it."""
from torch import nn

from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.parts import split_head


class PartSharingServer(Server):
    """A split model (``base.*``, ``head.*``); only the shared parts (the client class's ``shared``) go down,
    and the uploads carry only the shared entries, by name."""

    declares = Declares(
        checkpoint_skip=("shared_part",),  # a view of the global model, rebuilt every broadcast
    )

    def build_model(self, name=None):
        return split_head(super().build_model(name))

    def prepare_broadcast(self, participants) -> None:
        # The shared parts of the global model, the one payload every client receives (and what is counted):
        # the server's copy of a personal part is never sent.
        self.shared_part = nn.ModuleDict({name: getattr(self.global_model, name) for name in self.declares.client_class.shared})

    def broadcast(self, client):
        return self.shared_part

    def aggregate(self, uploads) -> None:
        """Sample-weighted mean of the uploaded entries; the others keep their values (never used)."""
        if uploads:
            self.average_uploads(uploads)
