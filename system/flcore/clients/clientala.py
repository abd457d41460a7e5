"""FedALA client: a FedAvg client whose local initialisation is always ALA (see servers/serverala.py)."""
from flcore.clients.clientbase import Client, ClientDeclares


class FedALAClient(Client):
    declares = ClientDeclares(
        use_ala=True,
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )
