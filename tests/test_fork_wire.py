"""What crosses the fork executor's pipe: runtime.fork.dumps sends dense tensors as raw bytes; every value
must arrive exactly as torch's own pickling delivers it (the reference), whichever path it took."""
import dataclasses
import pickle

import pytest
import torch
from torch import nn

from runtime import fork


@dataclasses.dataclass
class Record:
    state: dict
    extras: list


def payload():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    shared = torch.randn(4, generator=g)
    big = torch.randn(6, 5, generator=g)
    return {
        "model": model,
        "record": Record({k: v.clone() for k, v in model.state_dict().items()},
                         [torch.tensor(3), torch.tensor([True, False]), torch.arange(5, dtype=torch.int64),
                          torch.randn(3, generator=g).to(torch.float16)]),
        "param": nn.Parameter(torch.randn(2, 2, generator=g)),
        "leaf_grad": torch.randn(3, generator=g).requires_grad_(),
        "non_leaf": torch.randn(3, generator=g).requires_grad_() * 2,  # arrives a leaf that requires grad
        "bf16": torch.randn(3, generator=g).to(torch.bfloat16),  # no numpy dtype: torch's own pickling
        "transposed": big.t(),  # not contiguous
        "row": big[2],  # a view into a larger storage
        "channels_last": torch.randn(2, 3, 4, 4, generator=g).to(memory_format=torch.channels_last),
        # one channel: "contiguous" in both layouts, with channels-last strides (25, 1, 5, 1)
        "one_channel": torch.randn(2, 1, 5, 5, generator=g).to(memory_format=torch.channels_last),
        "twice": [shared, shared],  # one object twice stays one object
        "plain": (1, "a", 2.5, None),
    }


def tensors(obj, path=""):
    """(path, tensor) of every tensor in ``obj``, module parameters and buffers included."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, nn.Module):
        yield from ((f"{path}.{k}", v) for k, v in obj.state_dict(keep_vars=True).items())
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from tensors(getattr(obj, f.name), f"{path}.{f.name}")


def test_everything_arrives_as_torchs_own_pickling_delivers_it():
    sent = payload()
    got = pickle.loads(fork.dumps(sent))
    ref = pickle.loads(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))
    ours, theirs = dict(tensors(got)), dict(tensors(ref))
    assert ours.keys() == theirs.keys() and len(ours) > 15
    for k, t in theirs.items():
        o = ours[k]
        assert type(o) is type(t), k
        assert o.dtype == t.dtype and o.shape == t.shape and o.stride() == t.stride(), k
        assert o.requires_grad == t.requires_grad, k
        assert torch.equal(o, t), k
    assert got["twice"][0] is got["twice"][1]
    assert got["plain"] == sent["plain"] and isinstance(got["record"], Record)
    assert torch.equal(got["model"](torch.ones(1, 1, 4, 4)), sent["model"](torch.ones(1, 1, 4, 4)))


def test_raw_tensors_arrive_writable_and_unshared():
    t = torch.arange(6, dtype=torch.float32)
    got = pickle.loads(fork.dumps(t))
    got += 1  # a read-only buffer would refuse or warn
    assert torch.equal(t, torch.arange(6, dtype=torch.float32)) and torch.equal(got, t + 1)


@pytest.mark.parametrize("name", ["model", "param", "leaf_grad", "record"])
def test_dense_tensors_take_the_raw_path(name):
    """The raw path is really taken for dense tensors (the point of dumps), and not for a view."""
    assert b"_raw_tensor" in fork.dumps(payload()[name])
    assert b"_raw_tensor" not in fork.dumps(payload()["row"])
    assert b"_raw_tensor" not in fork.dumps(payload()["bf16"])
    assert b"_raw_tensor" in fork.dumps(payload()["one_channel"])


def test_a_worker_asks_linux_to_kill_it_with_its_parent(monkeypatch):
    calls = []

    class Libc:
        def prctl(self, option, sig):
            calls.append((option, sig))

    monkeypatch.setattr(fork.ctypes, "CDLL", lambda name, use_errno: Libc())
    fork._die_with_parent()
    assert calls == [(1, fork.signal.SIGKILL)]  # PR_SET_PDEATHSIG: SIGKILL when the parent dies
