"""Uploads as the server reads them: their entries named as a model names them, and sealed uploads."""
from __future__ import annotations

from torch import nn

from utils.errors import FLError


def trainable_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s parameters that training updates (``requires_grad``)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def aligned_names(model: nn.Module, state: dict) -> dict[str, str]:
    """{upload name: ``model``'s name} for an upload's state. Uploads of a part of the model (FedRep's body:
    ``model.base.state_dict()``) carry names relative to that part; they are prefixed with the submodule
    whose state they match. Empty when nothing matches."""
    own = set(model.state_dict())
    if set(state) <= own:
        return {k: k for k in state}
    for prefix, module in model.named_modules():
        if prefix and state and set(state) <= set(module.state_dict()):
            return {k: f"{prefix}.{k}" for k in state}
    return {}


class SealedUpload:
    """An upload whose contents only ``Server.average_uploads`` opens: under a robust aggregation rule the
    algorithm's ``aggregate`` receives these, so no computation of its server reads what a client sent outside
    the seam the rule guards. ``id`` and ``weight`` read as usual; reading ``state`` or ``extras`` stops the
    run with one line (the algorithm then declares ``robust_refusal``)."""

    __slots__ = ("_upload", "_why")

    def __init__(self, upload, why: str):
        self._upload, self._why = upload, why

    @property
    def id(self) -> int:
        return self._upload.id

    @property
    def weight(self) -> float:
        return self._upload.weight

    @property
    def state(self):
        raise FLError(f"{self._why} its uploads' model entries outside average_uploads; declare robust_refusal")

    @property
    def extras(self):
        raise FLError(f"{self._why} its uploads' extras ({', '.join(sorted(self._upload.extras)) or 'none'}) "
                      f"outside average_uploads; declare robust_refusal")

    def opened(self):
        """The upload itself, for the seam."""
        return self._upload
