"""LG-FedAvg client: local representation (``base``), shared head (see servers/serverlg.py)."""
from flcore.clients.partsharing import PartSharingClient


class LGFedAvgClient(PartSharingClient):
    shared = ("head",)
    personal_keys = ("base.",)
    # --executor batched: its loss reads its modules only (runtime/batched.py)
    batch_state = ()
