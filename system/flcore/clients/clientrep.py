"""FedRep client: a local head on a shared body; head epochs, then body epochs (see servers/serverrep.py).
Receiving the body (plain copy, or ALA on the body under the client's own head) is the model-splitting
family's (``PartSharingClient``, clients/clientper.py)."""
from __future__ import annotations

from flcore.clients.clientbase import ClientDeclares, Upload
from flcore.clients.partsharing import PartSharingClient
from flcore.trainmodel.parts import frozen


class FedRepClient(PartSharingClient):
    shared = ("base",)
    declares = ClientDeclares(
        personal_keys=("head.",),
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )

    def local_update(self, round_idx: int) -> None:
        with frozen(self.model.base):
            self.run_epochs(self.cfg.plocal_epochs)
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs)

    def upload(self) -> Upload:
        """Only the body crosses the wire, by the body's own names (``FedRepServer.aggregate`` loads it
        into the global body)."""
        return Upload(self.id, self.train_samples, self.model.base.state_dict())
