"""FedRep client: a local head on a shared body; head epochs, then body epochs (see servers/serverrep.py)."""
from __future__ import annotations

import copy

from flcore.clients.clientbase import Client, Upload, copy_state
from flcore.trainmodel.parts import ala_names, frozen


class FedRepClient(Client):
    personal_keys = ("head.",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.ala is not None:
            # ALA adapts the top of the body (-p tensors / --ala_layers): the head is this client's own, never received.
            self.ala.names = [f"base.{n}" for n in ala_names(self.model.base, self.cfg.layer_idx, self.cfg.ala_layers,
                                                             "FedRep's body")]

    def receive(self, global_model, participating: bool = True) -> None:
        """Only the body is received; the head stays."""
        if self.ala is None:
            self.initialize_local(self.model.base, global_model.base, participating)
            return
        # ALA's loss needs a whole network: the global body under this client's own head.
        received = copy.deepcopy(self.model)
        copy_state(received.base, global_model.base)
        self.initialize_local(self.model, received, participating)

    def local_update(self, round_idx: int) -> None:
        with frozen(self.model.base):
            self.run_epochs(self.cfg.plocal_epochs)
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs)

    def upload(self) -> Upload:
        """Only the body crosses the wire."""
        return Upload(self.id, self.train_samples, self.model.base.state_dict())
