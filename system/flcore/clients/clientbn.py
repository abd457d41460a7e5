"""FedBN client: every BatchNorm layer's parameters and running statistics stay on the client; the rest is
FedAvg's (see servers/serverbn.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from flcore.clients.clientbase import Client, ClientDeclares, Upload


def bn_prefixes(model: nn.Module) -> tuple[str, ...]:
    """State-dict name prefixes of ``model``'s BatchNorm layers, found by module type: torchvision's
    ResNet names some of them ``downsample.1``, which a substring test for 'bn' misses (PFLlib's filter)."""
    return tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))


def copy_shared(target: nn.Module, source: nn.Module, personal: tuple[str, ...]) -> None:
    """Overwrite ``target``'s entries with ``source``'s, in place, except those under ``personal``."""
    dst = target.state_dict()
    with torch.no_grad():
        for k, v in source.state_dict().items():
            if not k.startswith(personal):
                dst[k].copy_(v)


class FedBNClient(Client):
    declares = ClientDeclares(
        # Per instance (set in __init__ from the model's BatchNorm modules): every entry of every BatchNorm
        # layer, weight, bias, running mean / var and num_batches_tracked alike.
        personal_keys=(),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.personal_keys = bn_prefixes(self.model)

    def receive(self, global_model, participating: bool = True) -> None:
        """Everything but the BatchNorm layers comes from the global model. With ``-ala`` the received
        model is the global model under this client's own BatchNorm layers, so ALA's loss runs the network
        the client will train, and ALA never touches the BatchNorm entries."""
        if self.ala is None:
            copy_shared(self.model, global_model, self.personal_keys)
            return
        received = copy.deepcopy(self.model)
        copy_shared(received, global_model, self.personal_keys)
        self.initialize_local(self.model, received, participating)

    def upload(self) -> Upload:
        """The model without its BatchNorm entries."""
        state = {k: v for k, v in self.model.state_dict().items() if not k.startswith(self.personal_keys)}
        return Upload(self.id, self.train_samples, state)
