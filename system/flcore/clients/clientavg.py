"""FedAvg client: plain local SGD, all of it in the base class (see servers/serveravg.py)."""
from flcore.clients.clientbase import Client, ClientDeclares


class FedAvgClient(Client):
    """Everything is the base class's behaviour."""
    declares = ClientDeclares(
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )

