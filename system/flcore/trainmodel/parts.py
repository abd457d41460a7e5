"""Cutting models into parts: the paper's layers, the head/body split, and what ties samples together.

Every model of ``models.py`` keeps its classifier in the attribute ``HEAD`` = ``fc`` (the head contract; ``head_of``
reads it). From that:

- ``layer_groups``: parameter names grouped into "layers" (FedALA's ``-p``, PartialFed's per-layer choice);
- ``adapted_names``: the parameters of the top ``p`` layers; ``ala_names``: what ALA adapts (``-p``
  tensors, or ``--ala_layers`` layers);
- ``split_head``: the same network as ``base`` + ``head`` (FedRep, and the model-splitting family);
- ``frozen``: a part that takes no gradient inside a block (FedRep's alternating epochs);
- ``shared_shapes``: the shapes of what a model-heterogeneous algorithm exchanges (its head, features or logits);
- ``batch_dependent``: layers whose output for one sample depends on the rest of its batch or on random
  draws (BatchNorm, dropout), which rule out reusing one sample's features across batches.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from utils.batching import has_batch_norm
from utils.errors import FLError

NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
HEAD = "fc"  # the head contract: the attribute every model keeps its classifier in


def head_of(model: nn.Module) -> nn.Module:
    """The model's classifier (the head contract); a model without one cannot be split."""
    head = getattr(model, HEAD, None)
    if not isinstance(head, nn.Module):
        raise TypeError(f"{type(model).__name__} has no classifier attribute '{HEAD}'; cannot split its head")
    return head


def layer_groups(model: nn.Module) -> list[list[str]]:
    """Parameter names grouped into the paper's "layers", bottom to top.

    A layer is a module that owns parameters directly (conv, linear), with two groupings that follow the
    FedALA paper's count (its ResNet-18 sensitivity table: p = 2 is layer4 + fc, 8.4M parameters; p = 6
    is the whole network):
    - a normalisation layer (BatchNorm, GroupNorm, LayerNorm) joins the layer just below it, so the
      stem ``conv1`` + ``bn1`` is one layer and ``-m BNCNN`` has the CNN's four layers;
    - a stage of residual blocks (a module whose children all have a ``downsample`` attribute, i.e.
      torchvision's ``layer1`` .. ``layer4``) is one layer, and so is a residual block outside a stage.
    ResNet-18 thus has six layers: stem, layer1, layer2, layer3, layer4, fc."""
    groups: list[list[str]] = []
    claimed: set[str] = set()
    for mname, mod in model.named_modules():
        prefix = f"{mname}." if mname else ""
        children = list(mod.children())
        if hasattr(mod, "downsample") or (children and all(hasattr(c, "downsample") for c in children)):
            names = [prefix + n for n, _ in mod.named_parameters()]
        else:
            names = [prefix + n for n, _ in mod.named_parameters(recurse=False)]
        names = [n for n in names if n not in claimed]
        if not names:
            continue
        claimed.update(names)
        if isinstance(mod, NORMS) and groups:
            groups[-1].extend(names)
        else:
            groups.append(names)
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    groups.sort(key=lambda g: order[g[0]])
    return groups


def adapted_names(model: nn.Module, p: int, what: str = "the model") -> list[str]:
    """Names of the parameter tensors in the top ``p`` layers (all layers when ``p`` is 0)."""
    groups = layer_groups(model)
    if p < 0 or p > len(groups):
        raise FLError(f"--ala_layers {p}: {what} has {len(groups)} layer(s); choose 0 (all) to {len(groups)}")
    chosen = groups if p == 0 else groups[len(groups) - p:]
    return [n for g in chosen for n in g]


def ala_names(model: nn.Module, tensors: int, layers: int | None = None, what: str = "the model") -> list[str]:
    """The parameters ALA adapts: the top ``layers`` layers (``--ala_layers``, the FedALA paper's p) when
    given, else the last ``tensors`` parameter tensors (``-p``, PFLlib's count; 0 = all). PFLlib's default
    ``-p 2`` is the classifier's weight and bias: the paper's p = 1 on every model here."""
    if layers is not None:
        return adapted_names(model, layers, what)
    names = [n for n, _ in model.named_parameters()]
    if tensors < 0 or tensors > len(names):
        raise FLError(f"-p {tensors}: {what} has {len(names)} parameter tensors; choose 0 (all) to {len(names)} "
                      f"(or count layers with --ala_layers)")
    return names[len(names) - tensors:] if tensors else names


class BaseHeadSplit(nn.Module):
    """``head(base(x))``: the same network cut at its classifier, for algorithms that treat the feature
    extractor (``base``) and the classifier (``head``) differently (FedRep, FedPer, ...). Parameter names
    become ``base.*`` and ``head.*``."""

    def __init__(self, base: nn.Module, head: nn.Module):
        super().__init__()
        self.base, self.head = base, head

    def forward(self, x):
        return self.head(self.base(x))


def split_head(model: nn.Module) -> BaseHeadSplit:
    """A copy of ``model`` cut into base and head at its classifier (``head_of``, the head contract)."""
    head_of(model)
    base = copy.deepcopy(model)
    head = head_of(base)
    setattr(base, HEAD, nn.Identity())
    return BaseHeadSplit(base, head)


@contextlib.contextmanager
def frozen(module: nn.Module):
    """``module``'s parameters get no gradient inside the block (SGD then leaves them as they are). Its
    buffers (BatchNorm statistics) still follow train-mode forwards."""
    flags = [p.requires_grad for p in module.parameters()]
    for p in module.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(module.parameters(), flags):
            p.requires_grad_(f)


def batch_dependent(model: nn.Module) -> bool:
    """Whether one sample's output of ``model`` in training mode depends on more than that sample:
    BatchNorm mixes the samples of a batch, dropout draws a random mask."""
    return has_batch_norm(model) or any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
                                        for m in model.modules())


def shared_shapes(model: nn.Module, part: str, x: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """The shapes of what a model-heterogeneous algorithm exchanges of ``model`` (``ModelSupport.same_shape``):
    ``"head"`` its classifier's entries; ``"features"`` the shape of the classifier's input; ``"logits"``
    that of its output (both per sample, from one eval-mode forward of the inputs ``x``). The classifier is
    the split model's ``head`` (``split_head``), else ``fc`` (the head contract)."""
    head = model.head if isinstance(model, BaseHeadSplit) else head_of(model)
    if part == "head":
        return {k: tuple(v.shape) for k, v in head.state_dict().items()}
    seen = []
    hook = head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    was = model.training
    try:
        with torch.no_grad():
            out = model.eval()(x)
    finally:
        hook.remove()
        model.train(was)
    if part == "features":
        return {"features": tuple(seen[-1].shape[1:])}
    return {"logits": tuple(out.shape[1:])}
