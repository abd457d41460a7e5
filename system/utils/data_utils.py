"""Loading a generated split (``dataset/<name>/``) once into per-client tensors.

Format (written by ``dataset/generate_<Name>.py``): ``config.json`` plus ``train/<i>.npz`` and
``test/<i>.npz`` holding plain arrays ``x`` (uint8 pixels N x C x H x W, or float32 vectors N x D) and
``y`` (int64). Nothing is unpickled. Pixels are normalised here with the split's recorded mean/std.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from utils.errors import FLError

REPO_ROOT = Path(__file__).resolve().parents[2]
DATASET_ROOT = REPO_ROOT / "dataset"
# Splits that can be generated offline with default settings when missing.
OFFLINE_GENERATORS = {"Digits": "generate_Digits.py", "Synthetic": "generate_Synthetic.py"}


@dataclass
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass
class FederatedData:
    name: str
    config: dict
    config_hash: str
    clients: list[ClientData]

    @property
    def num_classes(self) -> int:
        return int(self.config["num_classes"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.config["input_shape"])


def generator_command(name: str) -> str:
    script = OFFLINE_GENERATORS.get(name, f"generate_{name}.py")
    if not (DATASET_ROOT / script).exists():
        script = "generate_<Name>.py"
    return f"python dataset/{script} --out {name} ..."


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            return f["x"], f["y"]
    except (OSError, KeyError, ValueError) as e:
        raise FLError(f"corrupt client file {path} ({e}); regenerate the split with its generator") from None


def _to_tensor(x: np.ndarray, norm: dict | None, device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    if t.dtype == torch.uint8:
        t = t.to(torch.float32).div_(255.0)
        if norm is not None:
            shape = (1, -1) + (1,) * (t.dim() - 2)
            mean = torch.tensor(norm["mean"], dtype=torch.float32).view(shape)
            std = torch.tensor(norm["std"], dtype=torch.float32).view(shape)
            t = (t - mean) / std
    elif t.is_floating_point():
        t = t.to(torch.float32)
    return t.to(device)


def load_split(name: str, root: Path | str = DATASET_ROOT, num_clients: int | None = None,
               device="cpu") -> FederatedData:
    """Read every client's train and test arrays once. ``num_clients`` (from ``-nc``) must not exceed the
    split's client count; when smaller, the first ``num_clients`` clients are used."""
    d = Path(root) / name
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise FLError(f"split '{name}' not found in {Path(root)}; generate it first: {generator_command(name)}")
    raw = cfg_path.read_bytes()
    config = json.loads(raw)
    have = int(config["num_clients"])
    n = have if num_clients is None else int(num_clients)
    if n > have:
        raise FLError(f"-nc {n} asks for more clients than split '{name}' has ({have}); "
                      f"use -nc {have} or regenerate with --num-clients {n}")
    norm = config.get("normalize")
    clients = []
    for i in range(n):
        xtr, ytr = _read_npz(d / "train" / f"{i}.npz")
        xte, yte = _read_npz(d / "test" / f"{i}.npz")
        clients.append(ClientData(_to_tensor(xtr, norm, device), torch.from_numpy(ytr).long().to(device),
                                  _to_tensor(xte, norm, device), torch.from_numpy(yte).long().to(device)))
    return FederatedData(name, config, hashlib.sha256(raw).hexdigest()[:16], clients)
