"""FedAdagrad client: FedAvg's (the algorithm is the server's step; see servers/serveradagrad.py)."""
from flcore.clients.clientavg import FedAvgClient


class FedAdagradClient(FedAvgClient):
    """Everything is FedAvg's client."""
