"""LG-FedAvg client: local representation (``base``), shared head (see servers/serverlg.py)."""
from flcore.clients.partsharing import PartSharingClient
from flcore.clients.clientbase import ClientDeclares


class LGFedAvgClient(PartSharingClient):
    shared = ("head",)
    declares = ClientDeclares(
        personal_keys=("base.",),
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )
