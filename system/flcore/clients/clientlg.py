"""LG-FedAvg client: local representation (``base``), shared head (see servers/serverlg.py)."""
from flcore.clients.clientper import PartSharingClient


class LGFedAvgClient(PartSharingClient):
    shared = ("head",)
    personal_keys = ("base.",)
