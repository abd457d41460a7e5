"""FedAvgM client: FedAvg's (the algorithm is the server's step; see servers/serveravgm.py)."""
from flcore.clients.clientavg import FedAvgClient


class FedAvgMClient(FedAvgClient):
    """Everything is FedAvg's client."""
