"""FedBABU client: the body trains under the fixed common head; evaluation fine-tunes a copy (see
servers/serverbabu.py)."""
from __future__ import annotations

from flcore.clients.finetune import FineTunedEval
from flcore.clients.clientbase import ClientDeclares
from flcore.clients.partsharing import PartSharingClient
from flcore.trainmodel.parts import frozen


class FedBABUClient(FineTunedEval, PartSharingClient):
    shared = ("base",)  # the head is not personal: it is the common initial one, and never sent
    declares = ClientDeclares(
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )

    def local_update(self, round_idx: int) -> None:
        """Body update only: the head takes no gradient, so SGD leaves it (the paper's head learning rate 0)."""
        with frozen(self.model.head):
            self.run_epochs(self.cfg.local_epochs)
