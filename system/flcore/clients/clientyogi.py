"""FedYogi client: FedAvg's (the algorithm is the server's step; see servers/serveryogi.py)."""
from flcore.clients.clientavg import FedAvgClient


class FedYogiClient(FedAvgClient):
    """Everything is FedAvg's client."""
