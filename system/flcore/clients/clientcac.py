"""FedCAC client: after local training it marks its critical parameters by sensitivity |θ ⊙ Δθ| and
uploads them with its model; it starts the next round from the model the server composed for it (see
servers/servercac.py)."""
from __future__ import annotations

import torch

from flcore.clients.clientbase import Client, Upload, copy_state


def critical_mask(before: torch.Tensor, after: torch.Tensor, tau: float) -> torch.Tensor:
    """The critical entries of one parameter tensor (bool, its shape): the top ``tau`` fraction by
    sensitivity s = |(θ_after − θ_before) ⊙ θ_after|, i.e. s >= the int(tau·numel)-th largest value. When
    fewer than that many entries have moved (the threshold is ~0), exactly the moved ones (s > 1e-20) are
    critical; a tensor that did not move at all has none."""
    s = ((after - before) * after).abs().reshape(-1)
    k = int(tau * s.numel())
    thresh = torch.topk(s, k).values[-1] if k > 0 else torch.tensor(float("inf"))
    if thresh <= 1e-10:
        moved = s[s > 1e-20]
        thresh = moved.min() if moved.numel() else torch.tensor(float("inf"))
    return (s >= thresh).reshape(after.shape)


class FedCACClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.critical: dict[str, torch.Tensor] | None = None  # by parameter name, from the last training

    def receive(self, payload, participating: bool = True) -> None:
        """``("own", state)``: the model the server composed for this client (critical entries from its
        collaborators' mean, the rest from the global model). ``("global", model)``: a client without a
        composed model this round keeps its critical entries and takes the rest from the global model."""
        kind, source = payload
        shared = self.cfg.bn_stats == "shared"
        if kind == "own":
            load_state(self.model, source, buffers=shared)
            return
        if self.critical is None:
            copy_state(self.model, source, buffers=shared)
            return
        glob = source.state_dict()
        with torch.no_grad():
            for k, p in self.model.named_parameters():
                p.copy_(torch.where(self.critical[k], p, glob[k]))
        if shared:
            load_state(self.model, {k: glob[k] for k, _ in self.model.named_buffers()}, buffers=True)

    def local_update(self, round_idx: int) -> None:
        before = {k: p.detach().clone() for k, p in self.model.named_parameters()}
        super().local_update(round_idx)
        self.critical = {k: critical_mask(before[k], p.detach(), self.cfg.tau)
                         for k, p in self.model.named_parameters()}

    def upload(self) -> Upload:
        """The whole model (the server averages it) and where its critical parameters are."""
        return Upload(self.id, self.train_samples, self.model.state_dict(), extras={"critical": self.critical})


def load_state(model, state: dict, buffers: bool = True) -> None:
    """Copy the entries of ``state`` into ``model`` in place (its buffers only when ``buffers``)."""
    dst = model.state_dict()
    skip = set() if buffers else {k for k, _ in model.named_buffers()}
    with torch.no_grad():
        for k, v in state.items():
            if k not in skip:
                dst[k].copy_(v)
