"""Mixed precision (``--amp``): the autocast context of forward passes and the fp16 loss scaler."""
from __future__ import annotations

import contextlib

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(cfg, device: torch.device):
    """The ``--amp`` autocast context for forward passes (a no-op context with ``--amp off``)."""
    dtype = DTYPES.get(cfg.amp)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(cfg, device: torch.device):
    """A loss scaler for ``--amp fp16`` (fp16 gradients underflow without one); None otherwise."""
    return torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
