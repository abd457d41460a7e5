"""FedAMP client: starts from its cloud model u_i, trains with a proximal term toward it, and keeps the
result w_i as its personalised model, the one evaluated (see servers/serveramp.py)."""
import copy

from flcore.clients.clientbase import Client, copy_state
from utils.proximal import anchor_of, proximal_term


class FedAMPClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cloud = anchor_of(self.model)  # u_i's parameters: the proximal anchor of this round
        # w_i, the personalised model: the model after this client's last local training (the common
        # initialisation before it first trains). ``self.model`` is the training model, from u_i.
        self.personal = copy.deepcopy(self.model)
        if self.ala is not None:
            # ALA's kept classifier inputs serve the evaluation of the ALA-initialised model; here the
            # evaluated model is w_i, whose lower layers are never those, so they would only cost time.
            self.ala.keep_features = False

    def receive(self, cloud_model, participating: bool = True) -> None:
        """The cloud model u_i the server built for this client (``FedAMPServer.broadcast``): a round's
        participant starts training from it; w_i, the evaluated model, is left as it is."""
        if not participating:
            return
        self.cloud = anchor_of(cloud_model)
        if self.ala is not None:  # ALA blends w_i with u_i (not a start left by a round it dropped out of)
            copy_state(self.model, self.personal)
        self.initialize_local(self.model, cloud_model, participating)

    def loss(self, x, y):
        mu = self.cfg.lamda / self.cfg.alphaK  # (λ / (2 α_k)) ||w - u_i||^2
        return super().loss(x, y) + proximal_term(self.model.parameters(), self.cloud, mu)

    def local_update(self, round_idx: int) -> None:
        super().local_update(round_idx)
        copy_state(self.personal, self.model)  # the trained model is the new w_i

    def eval_model(self):
        """w_i, the model this client trained last (not the cloud model u_i it received)."""
        return self.personal
