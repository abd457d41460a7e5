"""Loading a generated split (``dataset/<name>/``) once into per-client tensors.

Format (written by ``dataset/generate_<Name>.py``): ``config.json`` plus ``train/<i>.npz`` and
``test/<i>.npz`` holding plain arrays ``x`` and ``y`` (int64). ``x`` is uint8 pixels N x C x H x W,
float32 vectors N x D or series N x C x 1 x T, or, where config.json says ``"modality": "text"``, int64
token ids N x L (pad id 0, every id below the config's ``vocab_size``). Nothing is unpickled. Pixels are
normalised here with the split's recorded mean/std.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from utils import fileio
from utils.backdoor import white_value
from utils.errors import FLError
from utils.paths import DATASET_ROOT, GENERATORS_DIR, OFFLINE_GENERATORS, REPO_ROOT  # noqa: F401 - re-exported



@dataclass
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor | None = None  # --val_ratio: held out of the training data (``local_split``)
    y_val: torch.Tensor | None = None
    # images: a full-intensity pixel (255) after normalisation, (C, 1, 1); None for other inputs (--attack backdoor)
    white: torch.Tensor | None = None


@dataclass
class FederatedData:
    name: str
    config: dict
    config_hash: str
    clients: list[ClientData]
    new_clients: list[ClientData] = field(default_factory=list)  # -nnc: never trained, see Server

    @property
    def num_classes(self) -> int:
        return int(self.config["num_classes"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.config["input_shape"])


def generator_command(name: str) -> str:
    script = OFFLINE_GENERATORS.get(name, f"generate_{name}.py")
    if not (GENERATORS_DIR / script).exists():
        script = "generate_<Name>.py"
    return f"python dataset/{script} --out {name} ..."


def missing_split(name: str, root: Path | str) -> FLError:
    """The one line for a split that is not on disk: the command that makes it, and how to make it offline."""
    return FLError(f"split '{name}' not found in {Path(root)}; generate it first: {generator_command(name)} "
                   f"(offline: add --source FILE with a local copy of the data, README 'Generating client splits'; "
                   f"main.py takes --source too and generates the split with default settings)")


FORMAT_VERSION = 1  # the newest split format this library reads


def _bad_split(name: str, what: str) -> FLError:
    return FLError(f"split '{name}': {what}; regenerate it: {generator_command(name)}")


# Normalisation constants: finite and within bounds that keep float32 pixels finite ((x - mean) / std).
STD_MIN, NORM_MAX = 1e-6, 1e6


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= NORM_MAX


def read_config(name: str, d: Path) -> tuple[dict, bytes]:
    """``config.json`` of a split, its schema checked: every key this library reads, with its type."""
    try:  # a regular file (not a folder, FIFO or device), capped in size and nesting (utils/fileio.py)
        raw = fileio.read_bytes(d / "config.json", "config.json")
        config = fileio.parse_json(raw, "config.json")
    except fileio.FileIOError as e:
        raise _bad_split(name, str(e).replace(f"config.json {d / 'config.json'}", "config.json")) from None
    if not isinstance(config, dict):
        raise _bad_split(name, "config.json does not hold a JSON object")

    def need(key, ok, what):
        if key not in config:
            raise _bad_split(name, f"config.json lacks the key '{key}'")
        if not ok(config[key]):
            got = repr(config[key])
            raise _bad_split(name, f"config.json key '{key}' must be {what} (got {got[:60]}{'...' if len(got) > 60 else ''})")

    def count(v):  # a JSON integer >= 0; ``type(v) is int``: true and false are not numbers here
        return type(v) is int and v >= 0

    def pos_int(v):
        return count(v) and v >= 1

    need("num_clients", pos_int, "an integer >= 1")
    need("num_classes", lambda v: pos_int(v) and v <= 10 ** 6, "an integer in [1, 10^6]")
    need("input_shape", lambda v: isinstance(v, list) and 1 <= len(v) <= 4 and all(pos_int(e) and e <= 10 ** 5 for e in v),
         "a list of 1 to 4 integers in [1, 10^5]")
    n = config["num_clients"]
    for key in ("train_samples", "test_samples"):
        if key in config:
            need(key, lambda v: isinstance(v, list) and len(v) == n and all(count(e) for e in v),
                 f"a list of {n} sample counts")
    if "label_counts" in config:
        k = config["num_classes"]
        need("label_counts", lambda v: isinstance(v, list) and len(v) == n and all(
            isinstance(r, list) and len(r) == k and all(count(e) for e in r) for r in v),
             f"{n} rows of {k} per-class counts (num_classes)")
    if "modality" in config:
        need("modality", lambda v: v in ("image", "text", "vector", "series"), "one of image, text, vector, series")
    if "default_model" in config:
        need("default_model", lambda v: isinstance(v, str) and 0 < len(v) <= 64, "a model name")
    if config.get("modality") == "text" or "vocab_size" in config:
        need("vocab_size", lambda v: pos_int(v) and 2 <= v <= 10 ** 7, "an integer in [2, 10^7] (token ids "
             "0..vocab_size-1)")
    if "format_version" in config:
        need("format_version", lambda v: pos_int(v) and v <= FORMAT_VERSION,
             f"a format this library reads (1..{FORMAT_VERSION})")
    if config.get("normalize") is not None:
        c = config["input_shape"][0]
        need("normalize", lambda v: isinstance(v, dict) and all(
            isinstance(v.get(k), list) and len(v[k]) in (1, c) and all(_number(e) for e in v[k])
            for k in ("mean", "std")) and all(STD_MIN <= e for e in v["std"]),
             f"{{'mean': [...], 'std': [...]}} with 1 or {c} finite entries each (|mean| <= {NORM_MAX:g}, "
             f"{STD_MIN:g} <= std <= {NORM_MAX:g})")
    if "x_dtype" in config:
        need("x_dtype", lambda v: isinstance(v, str), "a numpy dtype name such as uint8")
    return config, raw


def _read_npz(name: str, path: Path, config: dict, part: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    """One client file, opened without unpickling and checked against the config: any read error is a
    corrupt file; x's dtype and shape, y's labels and the sample count must be what the config says."""
    def bad(what):
        return _bad_split(name, f"client file {path} {what}")

    if not os.path.lexists(path):
        raise bad("is missing")
    try:  # headers checked before any array is read; a regular file only; no pickle (utils/fileio.py)
        arrays = fileio.read_npz(path, ("x", "y"), "client file")
    except fileio.FileIOError as e:
        raise _bad_split(name, f"corrupt {e}") from None
    x, y = arrays["x"], arrays["y"]
    shape = tuple(config["input_shape"])
    if config.get("modality") == "text":
        if not np.issubdtype(x.dtype, np.integer):
            raise bad(f"holds x of dtype {x.dtype}; a text split holds integer token ids")
        if x.size and (x.min() < 0 or x.max() >= config["vocab_size"]):
            raise bad(f"holds token ids in [{x.min()}, {x.max()}]; the config's vocab_size is {config['vocab_size']}")
    elif x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
        raise bad(f"holds x of dtype {x.dtype}; expected uint8 pixels or float vectors")
    if x.shape[1:] != shape:
        raise bad(f"holds x of shape {x.shape}; the config's input_shape is {list(shape)}")
    if config.get("modality") != "text" and config.get("x_dtype", x.dtype.name) != x.dtype.name:
        raise bad(f"holds x of dtype {x.dtype}; the config's x_dtype is {config['x_dtype']}")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise bad("holds NaN or infinite values in x")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise bad(f"holds y of shape {y.shape} and dtype {y.dtype}; expected a 1-d integer array")
    if len(x) != len(y):
        raise bad(f"holds {len(x)} inputs but {len(y)} labels")
    if len(y) and (y.min() < 0 or y.max() >= config["num_classes"]):
        raise bad(f"holds labels in [{y.min()}, {y.max()}]; the config has {config['num_classes']} classes")
    counts = config.get(f"{part}_samples")
    if counts is not None and counts[i] != len(y):
        raise bad(f"holds {len(y)} samples; the config's {part}_samples says {counts[i]}")
    if part == "train" and not len(y):
        raise bad("holds no training samples")
    return x, y


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
    else:
        t = t.to(torch.int64)  # token ids
    return t.to(device)


def load_split(name: str, root: Path | str = DATASET_ROOT, num_clients: int | None = None,
               device="cpu", new_clients: int = 0) -> FederatedData:
    """Read every client's train and test arrays once, validated against the split's config (schema,
    dtypes, shapes, labels, sample counts: one line naming the file and what differs). ``num_clients``
    (from ``-nc``) must not exceed the split's client count; when smaller, the first ``num_clients``
    clients are used. ``new_clients`` (``-nnc``) more are loaded into ``FederatedData.new_clients``: the
    ones after the ``num_clients`` trained ones, or without ``num_clients`` the split's last ones (PFLlib)."""
    d = Path(root) / name
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise missing_split(name, root)
    config, raw = read_config(name, d)
    have = config["num_clients"]
    n = have - new_clients if num_clients is None else int(num_clients)
    if n < 1:
        raise FLError(f"-nc must be >= 1 (got {n})" if num_clients is not None else
                      f"-nnc {new_clients} leaves no client of split '{name}' ({have}) to train")
    if n + new_clients > have:
        asked = f"-nc {n} + -nnc {new_clients} = {n + new_clients}" if new_clients else f"-nc {n}"
        raise FLError(f"{asked} asks for more clients than split '{name}' has ({have}); "
                      f"use at most {have} or regenerate with --num-clients {n + new_clients}")
    norm = config.get("normalize")
    clients = []
    for i in range(n + new_clients):
        xtr, ytr = _read_npz(name, d / "train" / f"{i}.npz", config, "train", i)
        xte, yte = _read_npz(name, d / "test" / f"{i}.npz", config, "test", i)
        white = white_value(xtr.shape[1:], norm) if xtr.dtype == np.uint8 else None
        clients.append(ClientData(_to_tensor(xtr, norm, device), torch.from_numpy(ytr).long().to(device),
                                  _to_tensor(xte, norm, device), torch.from_numpy(yte).long().to(device),
                                  white=None if white is None else white.to(device)))
    if not any(len(c.y_test) for c in clients[:n]):
        raise _bad_split(name, f"every test split of its {n} client(s) is empty: there is nothing to evaluate")
    return FederatedData(name, config, hashlib.sha256(raw).hexdigest()[:16], clients[:n], clients[n:])


def few_shot_indices(y: torch.Tensor, shots: int, gen: torch.Generator) -> torch.Tensor:
    """``-fs K``: indices of K samples of each class in ``y`` (all of a class that has fewer), drawn from
    ``gen`` (PFLlib keeps each class's first K in file order), in increasing order."""
    perm = torch.randperm(len(y), generator=gen).to(y.device)
    ranked = y[perm]
    keep = torch.cat([perm[ranked == c][:shots] for c in torch.unique(y)])
    return keep.sort().values


def local_split(data: ClientData, cfg, run: int, cid: int) -> ClientData:
    """One client's data as its run sees it: with ``-fs K`` K training samples per class
    (``few_shot_indices``), then with ``--val_ratio r`` a validation split of round(r * n) of those (at
    least one, and one left to train on) held out of training. Both are drawn from the client's own
    (seed, run, id) streams; the test split is never touched."""
    from utils.seeding import torch_gen

    x, y = data.x_train, data.y_train
    if cfg.few_shot:
        keep = few_shot_indices(y, cfg.few_shot, torch_gen(cfg.seed, run, "few-shot", cid))
        x, y = x[keep], y[keep]
    x_val = y_val = None
    if cfg.val_ratio > 0:
        if len(y) < 2:
            raise FLError(f"--val_ratio: client {cid} has {len(y)} training sample(s); it needs 2 to hold one out")
        perm = torch.randperm(len(y), generator=torch_gen(cfg.seed, run, "validation", cid)).to(y.device)
        n_val = min(max(1, round(cfg.val_ratio * len(y))), len(y) - 1)
        val, keep = perm[:n_val], perm[n_val:].sort().values
        x_val, y_val, x, y = x[val], y[val], x[keep], y[keep]
    return ClientData(x, y, data.x_test, data.y_test, x_val, y_val, data.white)
