"""FedPer client: the model-splitting family's client (clients/partsharing.py) with a shared base and a local
head (see servers/serverper.py)."""
from flcore.clients.partsharing import PartSharingClient
from flcore.clients.clientbase import ClientDeclares


class FedPerClient(PartSharingClient):
    """Shared base, local head; local training is FedAvg's, on the whole model."""
    shared = ("base",)
    declares = ClientDeclares(
        personal_keys=("head.",),
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )
