"""FedCross client: evaluated on the global model, trains the middleware model it is dispatched (see
servers/servercross.py)."""
import copy

from flcore.clients.clientbase import Client, copy_state


class FedCrossClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The global model as last received: the evaluated model (traditional FL). ``self.model`` is the
        # training model, initialised from this round's middleware model.
        self.global_copy = copy.deepcopy(self.model)
        # With ALA: the model this client trained last, the "local model" ALA blends with the middleware
        # model (``self.model`` may still hold a middleware model from a round it dropped out of).
        self.trained = copy.deepcopy(self.model) if self.ala is not None else None
        if self.ala is not None:
            # ALA's kept classifier inputs serve the evaluation of the ALA-initialised model; the evaluated
            # model here is the global one, so they would only cost time.
            self.ala.keep_features = False

    def receive(self, payload, participating: bool = True) -> None:
        """``{"global": ..., "middleware": ...}``: the global model is kept for evaluation; a participant's
        middleware model becomes its training start (through ``initialize_local``, so ``-ala`` applies)."""
        copy_state(self.global_copy, payload["global"], buffers=self.cfg.bn_stats == "shared")
        if self.cfg.bn_stats == "local":  # evaluated with this client's own BatchNorm statistics
            own = dict(self.model.named_buffers())
            for name, buf in self.global_copy.named_buffers():
                buf.copy_(own[name])
        middleware = payload.get("middleware")
        if middleware is None:
            return
        if self.trained is not None:
            copy_state(self.model, self.trained)
        self.initialize_local(self.model, middleware, participating)

    def local_update(self, round_idx: int) -> None:
        super().local_update(round_idx)
        if self.trained is not None:
            copy_state(self.trained, self.model)

    def eval_model(self):
        """The global model (the mean of the server's middleware models), not the trained middleware model."""
        return self.global_copy
