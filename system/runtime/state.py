"""Explicit state: what a client or a server is, as tensors and plain values only.

A checkpoint (runtime/checkpoint.py) and a parked client (runtime/parking.py) hold the tree ``encode``
makes of an object's attributes, which ``torch.load(weights_only=True)`` reads back without running any
code from the file; ``decode`` puts it back onto a live object of the same class, freshly built by its
constructor (the structure: which modules, optimizers and streams it holds) from the flags and the split.

What the tree holds for each kind of value:
- tensors (copied to the CPU), ``None``, bools, numbers, strings, bytes; lists, tuples and dicts of them;
- a module: its ``state_dict``, which of its parameters are frozen and which submodules are in training
  mode; loaded into the live module (strictly: the same entries and shapes);
- an optimizer, or any object with ``state_dict`` / ``load_state_dict``: what its ``state_dict`` returns;
- torch and numpy random generators: their states; numpy arrays and scalars: their values;
- any other object (an ALA module, a DP accountant, the slow-client draws): its attributes, by the same
  rules, set on the live object of the same class;
- ``links``: objects the state refers to rather than holds (the run's config, data, clients, recorder),
  saved as their key wherever they occur and resolved to the live ones.
A module the fresh object does not hold yet (a copy made during training, such as a fine-tuned or a
previous model) is built by the owner's ``new_module(name)`` before its entries are loaded.
Anything else (a function, an open file) is refused when saving, with the attribute's name. When loading,
where the fresh object holds a module, tensor, optimizer or torch generator, the saved value must be one
too (or None): a state that puts a number or a string there is refused, with the attribute's path.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from utils.errors import FLError

KIND = "__state__"  # the key marking an encoded node that is not a plain dict
PLAIN = (type(None), bool, int, float, str, bytes)
# What a fresh object holds that only a value of the same family may replace (None aside: an attribute a
# round cleared): a checkpoint that puts a number or a string where the run has a model is refused.
STRUCTURED = (nn.Module, torch.Tensor, torch.optim.Optimizer, torch.Generator)
NUMPY_BITS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")
# What torch.load may raise on a file that is not a whole saved state (truncated, flipped bytes, crafted:
# weights_only refuses anything but tensors and plain values with an UnpicklingError).
UNREADABLE = (OSError, EOFError, RecursionError, MemoryError, RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError,
              UnicodeDecodeError, pickle.UnpicklingError, zipfile.BadZipFile)


class StateError(FLError):
    """A state that cannot be saved as data, or a saved state that does not fit the live object."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (torch's are often several), or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _copy(t: torch.Tensor) -> torch.Tensor:
    out = t.detach().to("cpu", copy=True)
    if isinstance(t, nn.Parameter):
        return nn.Parameter(out, t.requires_grad)
    return out.requires_grad_(t.requires_grad) if t.is_leaf and t.is_floating_point() else out


def encode(value, links: dict[int, str], where: str, memo: dict | None = None):
    """``value`` as tensors and plain values (see the module docstring); ``links``: id -> key. An object
    met twice (``[init] * n``, a tensor held in two places) is encoded once and shared, so the saved
    tree, and what ``decode`` makes of it, keep the aliasing of the original (``memo``: id -> encoded)."""
    memo = {} if memo is None else memo
    key = links.get(id(value))
    if key is not None:
        return {KIND: "link", "key": key}
    if isinstance(value, PLAIN):
        return value
    hit = memo.get(id(value))
    if hit is not None:
        return hit[1]
    out = _encode(value, links, where, memo)
    memo[id(value)] = (value, out)  # the value is held so that its id is not reused meanwhile
    return out


def _encode(value, links, where, memo):
    def enc(v, at):
        return encode(v, links, at, memo)

    if isinstance(value, torch.Tensor):
        return _copy(value)
    if isinstance(value, nn.Module):
        return {KIND: "module", "state": {k: _copy(v) for k, v in value.state_dict().items()},
                "training": [m.training for m in value.modules()],
                "frozen": [n for n, p in value.named_parameters() if not p.requires_grad]}
    if isinstance(value, torch.Generator):
        return {KIND: "torch_generator", "state": value.get_state(), "cpu": value.device.type == "cpu"}
    if isinstance(value, np.random.Generator):
        return {KIND: "numpy_generator", "state": value.bit_generator.state}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise StateError(f"{where}: a numpy array of Python objects cannot be saved as data")
        return {KIND: "ndarray", "data": torch.from_numpy(value.copy())}
    if isinstance(value, np.generic):
        return {KIND: "numpy_scalar", "dtype": value.dtype.str, "value": value.item()}
    if isinstance(value, torch.device):
        return {KIND: "device", "name": str(value)}
    if isinstance(value, dict):
        return {k: enc(v, f"{where}[{k!r}]") for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(enc(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (set, frozenset)):
        return {KIND: type(value).__name__, "items": [enc(v, where) for v in value]}
    kind = _type_name(value)
    if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
        return {KIND: "stateful", "type": kind, "state": enc(value.state_dict(), where)}
    if hasattr(value, "__dict__") and not callable(value):
        return {KIND: "object", "type": kind, "attrs": encode_attrs(value, links, where=where, memo=memo)}
    raise StateError(f"{where}: a {kind} cannot be saved as data; keep tensors and plain values on clients "
                     f"and servers, or name the attribute in checkpoint_skip if it is rebuilt from the flags")


def encode_attrs(obj, links: dict[int, str], skip=(), where: str | None = None, memo: dict | None = None) -> dict:
    """Every attribute of ``obj`` except those in ``skip``, encoded (aliasing kept across them)."""
    where = where or type(obj).__name__
    memo = {} if memo is None else memo
    return {k: encode(v, links, f"{where}.{k}", memo) for k, v in vars(obj).items() if k not in skip}


def _type_name(value) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


class _Decoder:
    """One ``decode_attrs`` pass: the links, the device, and what each saved node became (``memo``), so a
    node shared in the saved tree becomes one shared object again."""

    def __init__(self, links: dict, device):
        self.links, self.device, self.memo = links, device, {}
        self.linked = {id(v): k for k, v in links.items() if v is not None}

    def __call__(self, saved, live, where: str, new_module: Callable[[], nn.Module] | None = None):
        key = self.linked.get(id(live))
        if key is not None:  # the run's config, data, recorder, clients: never from a saved state
            if not (isinstance(saved, dict) and saved.get(KIND) == "link" and self.links.get(saved.get("key")) is live):
                raise StateError(f"{where}: the run's {key.split(':')[0]} comes from the flags and the split; the "
                                 f"saved state puts something else there")
            return live
        _same_kind(saved, live, where)
        if isinstance(saved, PLAIN):
            out = saved
        elif id(saved) in self.memo:
            out = self.memo[id(saved)][1]
        else:
            out = self._decode(saved, live, where, new_module)
            self.memo[id(saved)] = (saved, out)
        family = next((t for t in STRUCTURED if isinstance(live, t)), None)
        if family is not None and out is not None and not isinstance(out, family):
            raise StateError(f"{where}: a {family.__name__} in this run, a {type(out).__name__} in the saved state")
        return out

    def _decode(self, saved, live, where, new_module):
        if isinstance(saved, torch.Tensor):  # a copy: a saved state kept in memory is restored again later
            out = saved.detach().to(self.device, copy=True)
            if isinstance(saved, nn.Parameter):
                return nn.Parameter(out, saved.requires_grad)
            return out.requires_grad_(saved.requires_grad) if out.is_floating_point() else out
        if isinstance(saved, list):
            return [self(v, _item(live, i), f"{where}[{i}]") for i, v in enumerate(saved)]
        if isinstance(saved, tuple):
            return tuple(self(v, _item(live, i), f"{where}[{i}]") for i, v in enumerate(saved))
        if not isinstance(saved, dict):
            raise StateError(f"{where}: unexpected {type(saved).__name__}")
        kind = saved.get(KIND)
        if kind is None:
            return {k: self(v, live.get(k) if isinstance(live, dict) else None, f"{where}[{k!r}]")
                    for k, v in saved.items()}
        decoder = _DECODERS.get(kind)
        if decoder is None:
            raise StateError(f"{where}: unknown entry kind {kind!r}")
        try:
            return decoder(self, saved, live, where, new_module)
        except (KeyError, TypeError) as e:  # a node with a field missing or of the wrong kind
            raise StateError(f"{where}: damaged {kind} entry ({first_line(e)})") from None

    def attrs(self, obj, saved: dict, where: str, new_module: Callable[[str], nn.Module] | None = None,
              fixed=None, built=None) -> None:
        if not isinstance(saved, dict):
            raise StateError(f"{where}: expected the attributes of a {type(obj).__name__}, found "
                             f"{type(saved).__name__}")
        fixed = getattr(type(obj), "checkpoint_fixed", ()) if fixed is None else fixed
        built = getattr(type(obj), "checkpoint_built", ()) if built is None else built
        for k, v in saved.items():
            if not isinstance(k, str) or not k.isidentifier() or k.startswith("__"):
                raise StateError(f"{where}: attribute name {str(k)[:40]!r} is not an attribute name")
            if k not in vars(obj) and _behaviour(type(obj), k):
                raise StateError(f"{where}.{k}: a saved value would replace a method or property of "
                                 f"{type(obj).__name__}")
            if k in built and vars(obj).get(k) is None and v is not None:
                raise StateError(f"{where}.{k}: this run's flags build none, the saved state holds one (a state of "
                                 f"a run with other flags)")
            if k in fixed and (type(v) is not type(vars(obj).get(k)) or v != vars(obj).get(k)):
                raise StateError(f"{where}.{k}: saved {str(v)[:40]!r}, this run's is {vars(obj).get(k)!r} (a "
                                 f"state of another client or run)")
            make = (lambda k=k: new_module(k)) if new_module is not None else None
            vars(obj)[k] = self(v, vars(obj).get(k), f"{where}.{k}", make)


def _behaviour(cls, name: str) -> bool:
    """Whether ``cls`` defines ``name`` as behaviour (a method, property or other descriptor), which an
    instance attribute from a saved state would hide."""
    import inspect

    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and (callable(attr) or hasattr(attr, "__get__"))


def _same_kind(saved, live, where: str) -> None:
    """A plain value where the fresh object holds one: of the same kind (a string for a string, an integer
    for an integer, a number for a float, a bool for a bool)."""
    if live is None or saved is None:
        return
    if not isinstance(live, PLAIN):
        kind = saved.get(KIND) if type(saved) is dict else None
        expected = {list: list, tuple: tuple, dict: dict, set: "set", frozenset: "frozenset", np.ndarray: "ndarray",
                    torch.device: "device", np.random.Generator: "numpy_generator"}.get(type(live))
        if expected is None and isinstance(live, np.generic):
            expected = "numpy_scalar"
        if expected is None:
            if callable(live) and not isinstance(live, (nn.Module, torch.Tensor)) and kind != "link":
                raise StateError(f"{where}: this run holds behaviour (a {type(live).__name__}) there")
            return
        got = kind if kind is not None else type(saved)
        if got != expected:
            raise StateError(f"{where}: a {type(live).__name__} in this run, a "
                             f"{kind or type(saved).__name__} in the saved state")
        return
    if isinstance(live, bool):
        ok = isinstance(saved, bool)
    elif isinstance(live, int):
        ok = isinstance(saved, int) and not isinstance(saved, bool)
    elif isinstance(live, float):
        ok = isinstance(saved, (int, float)) and not isinstance(saved, bool)
    else:
        ok = isinstance(saved, type(live))
    if not ok:
        raise StateError(f"{where}: a {type(live).__name__} in this run, a {type(saved).__name__} in the saved state")


def decode(saved, live, links: dict, device, where: str):
    """The value ``saved`` stands for, put onto ``live`` (the fresh object's value there) where it holds
    structure (modules, optimizers, generators, objects); tensors go to ``device``."""
    return _Decoder(links, device)(saved, live, where)


def decode_attrs(obj, saved: dict, links: dict, device, where: str | None = None,
                 new_module: Callable[[str], nn.Module] | None = None, fixed=None, built=None) -> None:
    """Set the attributes ``encode_attrs`` saved on the live ``obj``. ``new_module(name)`` builds a module
    for attribute ``name`` that ``obj`` does not hold yet. ``fixed``: attributes whose saved value must equal
    the live one (whose state it is); ``built``: attributes the constructor builds from the flags, so a saved
    value where the live one is None is refused (by default the class's ``checkpoint_fixed`` and
    ``checkpoint_built``)."""
    _Decoder(links, device).attrs(obj, saved, where or type(obj).__name__, new_module, fixed, built)


def _item(live, i):
    return live[i] if isinstance(live, (list, tuple)) and i < len(live) else None


def _link(dec, saved, live, where, new_module):
    try:
        return dec.links[saved["key"]]
    except (KeyError, TypeError):
        raise StateError(f"{where}: refers to {saved.get('key')!r}, which this run does not have") from None


def _module(dec, saved, live, where, new_module):
    if not isinstance(live, nn.Module):
        if new_module is None:
            raise StateError(f"{where}: a module this object does not hold")
        live = new_module()
    entries = {k: dec(v, None, f"{where}[{k!r}]") for k, v in saved["state"].items()}
    try:
        live.load_state_dict(entries)
    except RuntimeError as e:
        raise StateError(f"{where}: {first_line(e)}") from None
    modules, training = list(live.modules()), saved["training"]
    if not isinstance(training, list) or not all(type(t) is bool for t in training) or not isinstance(
            saved["frozen"], list) or not all(type(n) is str for n in saved["frozen"]):
        raise StateError(f"{where}: damaged module entry (training flags and frozen names)")
    if len(modules) != len(training):
        raise StateError(f"{where}: {len(training)} submodules saved, the model has {len(modules)}")
    for m, flag in zip(modules, training):
        m.training = bool(flag)
    frozen = set(saved["frozen"])
    for n, p in live.named_parameters():
        p.requires_grad_(n not in frozen)
    return live


def _torch_generator(dec, saved, live, where, new_module):
    if not isinstance(live, torch.Generator):
        live = torch.Generator(device="cpu" if saved["cpu"] else dec.device)
    try:
        live.set_state(saved["state"])
    except RuntimeError as e:
        raise StateError(f"{where}: not a generator state ({first_line(e)})") from None
    return live


def _numpy_generator(dec, saved, live, where, new_module):
    state = saved["state"]
    bits = state.get("bit_generator") if isinstance(state, dict) else None
    if bits not in NUMPY_BITS:
        raise StateError(f"{where}: unknown numpy bit generator {bits!r}")
    if not isinstance(live, np.random.Generator) or type(live.bit_generator).__name__ != bits:
        live = np.random.Generator(getattr(np.random, bits)())
    try:
        live.bit_generator.state = state
    except (ValueError, OverflowError) as e:  # e.g. a number out of the generator's range
        raise StateError(f"{where}: not a {bits} state ({first_line(e)})") from None
    return live


def _ndarray(dec, saved, live, where, new_module):
    return saved["data"].numpy().copy()


def _numpy_scalar(dec, saved, live, where, new_module):
    return np.dtype(saved["dtype"]).type(saved["value"])


def _device(dec, saved, live, where, new_module):
    return live if isinstance(live, torch.device) else torch.device(saved["name"])  # the run's own device


def _set(dec, saved, live, where, new_module):
    items = (dec(v, None, where) for v in saved["items"])
    return set(items) if saved[KIND] == "set" else frozenset(items)


def _fitting(saved, live, where: str):
    if live is None or _type_name(live) != saved["type"]:
        found = "nothing" if live is None else f"a {_type_name(live)}"
        raise StateError(f"{where}: saved a {saved['type']}, this object holds {found}")


def _stateful(dec, saved, live, where, new_module):
    _fitting(saved, live, where)
    entries = dec(saved["state"], None, where)
    try:
        live.load_state_dict(entries)
    except (RuntimeError, ValueError) as e:
        raise StateError(f"{where}: {first_line(e)}") from None
    return live


def _object(dec, saved, live, where, new_module):
    _fitting(saved, live, where)
    dec.attrs(live, saved["attrs"], where)
    return live


_DECODERS = {"link": _link, "module": _module, "torch_generator": _torch_generator,
             "numpy_generator": _numpy_generator, "ndarray": _ndarray, "numpy_scalar": _numpy_scalar,
             "device": _device, "set": _set, "frozenset": _set, "stateful": _stateful, "object": _object}


def map_tensors(tree, fn):
    """``tree`` (an encoded state) with every tensor ``t`` in it replaced by ``fn(t)``."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: map_tensors(v, fn) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(map_tensors(v, fn) for v in tree)
    return tree


def write_file(tree, target) -> None:
    """Save an encoded state: a SHA-256 line, then ``torch.save``'s bytes (the checksum catches a changed
    byte anywhere, which torch's format itself would load as different numbers). ``target``: an open file
    (``fileio.Folder.replace`` gives one), or a path, written through its folder."""
    from utils import fileio

    buf = io.BytesIO()
    torch.save(tree, buf)
    blob = buf.getvalue()
    data = hashlib.sha256(blob).hexdigest().encode() + b"\n" + blob
    if hasattr(target, "write"):
        target.write(data)
    else:
        path = Path(target)
        fileio.write_bytes(fileio.Folder(path.parent, create=False, what="folder"), path.name, data)


def read_file(path: Path, map_location=None):
    """Load what ``write_file`` saved, tensors and plain values only (``weights_only=True``: nothing in
    the file can run code): a regular file, never through a symlink (``fileio.read_bytes``), nested at most
    ``fileio.MAX_DEPTH`` deep. A changed, cut or foreign file raises ``StateError`` (its checksum, its
    depth, a FIFO or a symlink) or one of ``UNREADABLE`` (torch.load; ``pickle.UnpicklingError`` for
    anything but tensors and plain values)."""
    from utils import fileio

    try:
        data = fileio.read_bytes(path, "saved state", cap=fileio.STATE_CAP, follow=False)
    except fileio.FileIOError as e:
        raise StateError(str(e).removeprefix(f"saved state {path} ")) from None
    digest, blob = data[:64], data[65:]
    if data[64:65] != b"\n" or hashlib.sha256(blob).hexdigest().encode() != digest:
        raise StateError("its checksum does not match: the file was changed or cut short")
    tree = torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)
    if fileio.depth(tree, fileio.MAX_DEPTH) > fileio.MAX_DEPTH:
        raise StateError(f"it is nested more than {fileio.MAX_DEPTH} levels deep")
    return tree
