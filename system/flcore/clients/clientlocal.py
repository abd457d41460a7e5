"""Local client: plain local SGD on its own model (see servers/serverlocal.py)."""
from flcore.clients.clientbase import Client, ClientDeclares, Upload


class LocalClient(Client):
    declares = ClientDeclares(
        personal_keys=("",),  # the whole model
        # --executor batched: its loss reads its modules only (runtime/batched.py)
        batch_state=(),
    )

    def upload(self) -> Upload:
        """Nothing crosses the wire."""
        return Upload(self.id, self.train_samples)
