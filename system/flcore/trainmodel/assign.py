"""``--client_models``: which architecture each client trains (model-heterogeneous pFL). Torch-free, so the
flag parser can check the value before anything is built.

The value is one of:

- a preset name (``PRESETS``): a list of architectures in the style of the heterogeneous-extractor settings
  ("HtFE") of Zhang et al.'s HtFLlib;
- a comma-separated list of ``-m`` names, ``CNN1,CNN,CNN3``: client i trains the (i mod k)-th of the k;
- the path of a JSON file (its name ends in ``.json``) holding one object, client id -> ``-m`` name,
  ``{"0": "CNN", "1": "ResNet10", ...}``, listing every client of the run exactly once. The file is read
  as data (``json``), never run.

Every architecture is built with its classifier ``fc`` taking ``-fd`` features (``models.build_client_model``),
so features, prototypes and heads have one shape on every client.
"""
from __future__ import annotations

import json
from pathlib import Path

from flcore.trainmodel.names import ALIASES, MODELS
from utils.errors import FLError

# Presets, CPU-friendly first. HtFE-cnn: three plain CNNs of one, two and three convolutions (widths 16,
# 32-64, 32-64-128). HtFE-img: the same and ResNet-10, one step of which costs more than one of each of the
# other three at 28x28 on a CPU. HtFE-img-large: HtFLlib's kind of mix (the 4-layer CNN, ResNet-10/18,
# MobileNetV2), several times the cost of a round. HtFE-text: the four text classifiers.
PRESETS: dict[str, tuple[str, ...]] = {
    "HtFE-cnn": ("CNN1", "CNN", "CNN3"),
    "HtFE-img": ("CNN1", "CNN", "CNN3", "ResNet10"),
    "HtFE-img-large": ("CNN", "ResNet10", "ResNet18", "MobileNet"),
    "HtFE-text": ("fastText", "TextCNN", "LSTM", "Transformer"),
}


def _model(name: str, where: str) -> str:
    """``name`` as registered (an alias or another case accepted), or one line naming the valid ones."""
    known = {**{a.lower(): m for a, m in ALIASES.items()}, **{m.lower(): m for m in MODELS}}
    found = known.get(str(name).strip().lower())
    if found is None:
        raise FLError(f"--client_models: unknown model '{name}' {where}; choose from {', '.join(MODELS)} "
                      f"or a preset ({', '.join(PRESETS)})")
    return found


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    repeated = next((k for k in keys if keys.count(k) > 1), None)
    if repeated is not None:
        raise FLError(f"--client_models: client '{repeated}' is listed twice in the JSON map")
    return dict(pairs)


def read_client_models(value: str) -> tuple[str, ...] | dict[int, str]:
    """The architectures ``--client_models value`` names: a tuple assigned to clients in turn (a preset or a
    comma list), or a dict client id -> model (a JSON file). Anything malformed raises FLError with one line."""
    value = value.strip()
    if value in PRESETS:
        return PRESETS[value]
    if not value.lower().endswith(".json"):
        names = [n for n in value.split(",")]
        if not value or any(not n.strip() for n in names):
            raise FLError(f"--client_models '{value}': give a preset ({', '.join(PRESETS)}), a comma list of "
                          f"models (CNN1,CNN,CNN3) or a .json file mapping client ids to models")
        return tuple(_model(n, "in the list") for n in names)
    from utils import fileio

    path = Path(value)
    try:  # a regular file, capped in size and nesting (utils/fileio.py)
        text = fileio.read_bytes(path, "--client_models", cap=fileio.CONFIG_CAP).decode("utf-8")
        fileio.parse_json(text, f"--client_models {path}")
    except UnicodeDecodeError as e:
        raise FLError(f"--client_models: cannot read {path} (UnicodeDecodeError: {e})") from None
    except fileio.FileIOError as e:
        raise FLError(f"--client_models: {str(e).removeprefix('--client_models ')}") from None
    try:
        table = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        raise FLError(f"--client_models: {path} is not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(table, dict) or not table:
        raise FLError(f"--client_models: {path} must hold one non-empty JSON object, client id -> model name")
    out: dict[int, str] = {}
    for key, name in table.items():
        if not (key.isascii() and key.isdigit()):
            raise FLError(f"--client_models: {path}: '{key}' is not a client id (0, 1, 2, ...)")
        if not isinstance(name, str):
            raise FLError(f"--client_models: {path}: client {key} maps to {json.dumps(name)}, not a model name")
        if int(key) in out:
            raise FLError(f"--client_models: client {int(key)} is listed twice in the JSON map ('{key}')")
        out[int(key)] = _model(name, f"for client {key} in {path}")
    return out


def assign(spec: tuple[str, ...] | dict[int, str], num_clients: int) -> list[str]:
    """Each of clients 0 .. ``num_clients``-1's architecture: in turn from a tuple, or from the map, which
    must list exactly those clients."""
    if isinstance(spec, tuple):
        return [spec[i % len(spec)] for i in range(num_clients)]
    missing = [i for i in range(num_clients) if i not in spec]
    extra = sorted(i for i in spec if i >= num_clients)
    if missing or extra:
        what = (f"has no model for client(s) {', '.join(map(str, missing[:5]))}" if missing else
                f"names client(s) {', '.join(map(str, extra[:5]))}")
        raise FLError(f"--client_models: the JSON map {what}, but the run has clients 0 .. {num_clients - 1}; "
                      f"list each of them once")
    return [spec[i] for i in range(num_clients)]
