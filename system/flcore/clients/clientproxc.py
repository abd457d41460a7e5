"""FedProx-C client: FedProx training, evaluation on a fine-tuned copy (see servers/serverproxc.py)."""
from flcore.clients.clientprox import FedProxClient
from flcore.clients.finetune import FineTunedEval


class FedProxCClient(FineTunedEval, FedProxClient):
    """FedProx's training; only evaluation differs."""
