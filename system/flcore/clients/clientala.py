"""FedALA client: a FedAvg client whose local initialisation is always ALA (see servers/serverala.py)."""
from flcore.clients.clientbase import Client


class FedALAClient(Client):
    use_ala = True
