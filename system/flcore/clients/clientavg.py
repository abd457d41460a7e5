"""FedAvg client: plain local SGD, all of it in the base class (see servers/serveravg.py)."""
from flcore.clients.clientbase import Client


class FedAvgClient(Client):
    batched_training = True  # the base loop on cross-entropy (utils/engine.py)
