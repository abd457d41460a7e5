"""FedAvg-C client: FedAvg's training, evaluation on a fine-tuned copy (see servers/serveravgc.py)."""
from flcore.clients.clientavg import FedAvgClient
from flcore.clients.finetune import FineTunedEval


class FedAvgCClient(FineTunedEval, FedAvgClient):
    """FedAvg's training; only evaluation differs."""
