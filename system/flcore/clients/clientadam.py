"""FedAdam client: FedAvg's (the algorithm is the server's step; see servers/serveradam.py)."""
from flcore.clients.clientavg import FedAvgClient


class FedAdamClient(FedAvgClient):
    """Everything is FedAvg's client."""
