"""FedProx-C client: FedProx training, evaluation on a fine-tuned copy (see servers/serverproxc.py)."""
from flcore.clients.clientavgc import FineTunedEval
from flcore.clients.clientprox import FedProxClient


class FedProxCClient(FineTunedEval, FedProxClient):
    """FedProx's training; only evaluation differs."""
