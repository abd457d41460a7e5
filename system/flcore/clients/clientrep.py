"""FedRep client: a local head on a shared body; head epochs, then body epochs (see servers/serverrep.py)."""
from __future__ import annotations

import contextlib
import copy

from torch import nn

from flcore.clients.clientbase import Client, copy_state
from utils.ALA import adapted_names


@contextlib.contextmanager
def frozen(module: nn.Module):
    """``module``'s parameters get no gradient inside the block (SGD then leaves them as they are). Its
    buffers (BatchNorm statistics) still follow train-mode forwards, as in the official code."""
    flags = [p.requires_grad for p in module.parameters()]
    for p in module.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(module.parameters(), flags):
            p.requires_grad_(f)


class FedRepClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.ala is not None:
            # ALA adapts the top -p layers of the body: the head is this client's own, never received.
            self.ala.names = [f"base.{n}" for n in adapted_names(self.model.base, self.cfg.layer_idx)]

    def receive_global(self, global_model, participating: bool = True) -> None:
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

    def upload(self) -> dict:
        """Only the body crosses the wire."""
        return {"id": self.id, "weight": self.train_samples, "state": self.model.base.state_dict()}
