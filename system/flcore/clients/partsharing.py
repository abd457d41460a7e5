"""The model-splitting family's client: it receives and uploads only the shared parts of a split model
(``base`` and/or ``head``, ``flcore.trainmodel.parts.split_head``) and keeps the rest as its own (the server
side: servers/partsharing.py)."""
from __future__ import annotations

import copy

from torch import nn

from flcore.clients.clientbase import Client, Upload, copy_state
from flcore.trainmodel.parts import ala_names


class PartSharingClient(Client):
    """A client whose model's submodules named in ``shared`` come from the server and go back to it;
    every other entry stays on the client. ``personal_keys`` must name the rest."""
    shared: tuple[str, ...] = ("base",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.ala is not None:
            # ALA adapts the top of the received part only (-p tensors / --ala_layers): the local part is
            # never received.
            part = nn.ModuleDict({name: getattr(self.model, name) for name in self.shared})
            self.ala.names = ala_names(part, self.cfg.layer_idx, self.cfg.ala_layers,
                                       f"{self.cfg.algorithm} receives only its {' + '.join(self.shared)}, which")

    def shared_state(self, model: nn.Module) -> dict:
        prefixes = tuple(f"{name}." for name in self.shared)
        return {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}

    def receive(self, global_model, participating: bool = True) -> None:
        """The shared parts become the global ones (plain copy, or ALA under the client's own parts)."""
        if self.ala is None:
            for name in self.shared:
                self.initialize_local(getattr(self.model, name), getattr(global_model, name), participating)
            return
        # ALA's loss needs a whole network: the received parts under this client's own local part.
        received = copy.deepcopy(self.model)
        for name in self.shared:
            copy_state(getattr(received, name), getattr(global_model, name))
        self.initialize_local(self.model, received, participating)

    def upload(self) -> Upload:
        """Only the shared entries cross the wire, by their full names (``base.*`` / ``head.*``)."""
        return Upload(self.id, self.train_samples, self.shared_state(self.model))
