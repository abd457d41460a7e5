"""Communication accounting: the bytes of what crosses the wire, counted from the objects actually sent
(broadcast payloads and uploads), as the tensors' sizes. A model counts its whole state (parameters and
buffers); numbers count 8 bytes; anything else (names, flags) counts nothing."""
from __future__ import annotations

import dataclasses
import numbers

import torch
from torch import nn


def payload_bytes(obj, _seen: set | None = None) -> int:
    """Bytes of the tensors in ``obj`` (a tensor, a module, an ``Upload``, or dicts / lists / tuples of them),
    each tensor counted once."""
    seen = set() if _seen is None else _seen
    if obj is None or isinstance(obj, (str, bytes, bool)):
        return 0
    if isinstance(obj, torch.Tensor):
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return obj.nelement() * obj.element_size()
    if isinstance(obj, numbers.Number):
        return 8
    if isinstance(obj, nn.Module):
        return sum(payload_bytes(t, seen) for t in obj.state_dict(keep_vars=True).values())
    if isinstance(obj, dict):
        return sum(payload_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v, seen) for v in obj)
    if dataclasses.is_dataclass(obj):
        return sum(payload_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj)
                   if f.name != "id")
    return 0
