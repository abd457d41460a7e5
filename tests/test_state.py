"""runtime/state.py by hand: every kind of value survives encode -> write_file -> read_file -> decode onto a
freshly built object (values, aliasing, frozen parameters, training flags, stream positions), and every state
that does not fit is refused with the attribute's path."""
import functools
import re

import numpy as np
import pytest
import torch
from torch import nn

from runtime import state
from runtime.state import StateError, decode, decode_attrs, encode, encode_attrs, map_tensors


class Counter:
    """Stateful through state_dict / load_state_dict, like an optimizer or a scheduler."""

    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, d):
        self.count = d["count"]


class Inner:
    def __init__(self):
        self.weights = {"a": torch.zeros(2)}
        self.steps = 0


class Owner:
    """What a client holds, in miniature. ``fresh()`` is what its constructor would build."""

    def __init__(self, cfg, seed: int):
        torch.manual_seed(seed)
        self.cfg = cfg  # a link: saved as its key, resolved to the live run's
        self.model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.inner = Inner()
        self.counter = Counter()
        self.device = torch.device("cpu")


def trained(cfg) -> Owner:
    o = Owner(cfg, 1)
    loss = o.model(torch.randn(5, 3)).sum()
    loss.backward()
    o.opt.step()  # momentum buffers
    o.model[2].weight.requires_grad_(False)  # a frozen parameter
    o.model[1].eval()  # one submodule in eval mode
    torch.rand(3, generator=o.gen)
    o.rng.random(4)  # both streams advanced
    o.inner.weights["a"] = torch.tensor([0.25, -1.5])
    o.inner.steps = 7
    o.counter.count = 3
    shared = torch.arange(4.0)
    o.pair = [shared, shared]  # one tensor held twice
    o.alias = shared
    o.scale = nn.Parameter(torch.tensor([2.0, 3.0]), requires_grad=False)
    o.leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    o.counts = torch.tensor([3, 1])
    o.table = np.array([[1.5, 2.5]])
    o.best = np.float32(0.75)
    o.seen = {1, 4}
    o.frozen_ids = frozenset({2})
    o.mixed = {"t": (1, "two", None, b"3", 4.5), "l": [True, torch.ones(1)]}
    return o


def round_trip(o, cfg, tmp_path):
    links = {id(cfg): "cfg"}
    path = tmp_path / "owner.pt"
    state.write_file(encode_attrs(o, links), path)
    fresh = Owner(cfg, 2)  # other values, same structure
    decode_attrs(fresh, state.read_file(path), {"cfg": cfg}, "cpu", "owner")
    return fresh


def test_every_kind_of_value_round_trips_through_a_file(tmp_path):
    cfg = object()
    o = trained(cfg)
    got = round_trip(o, cfg, tmp_path)
    assert got.cfg is cfg and got.device == torch.device("cpu")
    for (k, v), (k2, v2) in zip(o.model.state_dict().items(), got.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    assert [p.requires_grad for p in got.model.parameters()] == [True, True, True, True, False, True]
    assert [m.training for m in got.model.modules()] == [True, True, False, True]
    buf = [got.opt.state[p]["momentum_buffer"] for p in got.model.parameters()]
    assert all(torch.equal(b, o.opt.state[p]["momentum_buffer"]) for b, p in zip(buf, o.model.parameters()))
    assert got.opt.param_groups[0]["params"][0] is got.model[0].weight  # the live optimizer, on the live model
    assert torch.equal(torch.rand(3, generator=got.gen), torch.rand(3, generator=o.gen))
    assert got.rng.random(2).tolist() == o.rng.random(2).tolist()
    assert got.inner.weights["a"].tolist() == [0.25, -1.5] and got.inner.steps == 7 and got.counter.count == 3
    assert got.pair[0] is got.pair[1] is got.alias and got.alias.tolist() == [0.0, 1.0, 2.0, 3.0]  # aliasing kept
    assert type(got.scale) is nn.Parameter and not got.scale.requires_grad and got.scale.tolist() == [2.0, 3.0]
    assert type(got.leaf) is torch.Tensor and got.leaf.requires_grad and got.leaf.is_leaf
    assert got.counts.dtype == torch.int64 and not got.counts.requires_grad and got.counts.tolist() == [3, 1]
    assert isinstance(got.table, np.ndarray) and got.table.tolist() == [[1.5, 2.5]]
    assert type(got.best) is np.float32 and got.best == np.float32(0.75)
    assert got.seen == {1, 4} and type(got.seen) is set and got.frozen_ids == frozenset({2})
    assert type(got.frozen_ids) is frozenset
    assert got.mixed["t"] == (1, "two", None, b"3", 4.5) and type(got.mixed["t"]) is tuple
    assert got.mixed["l"][0] is True and got.mixed["l"][1].tolist() == [1.0]


def test_saved_copies_are_independent_and_on_the_cpu():
    t = torch.ones(2, requires_grad=True)
    mid = t * 2  # not a leaf: saved without a graph
    out = encode({"t": t, "mid": mid, "ints": torch.tensor([1])}, {}, "x")
    assert out["t"] is not t and out["t"].requires_grad and out["t"].is_leaf
    assert not out["mid"].requires_grad and out["mid"].tolist() == [2.0, 2.0]
    with torch.no_grad():
        t.add_(1.0)
    assert out["t"].tolist() == [1.0, 1.0]  # a copy, not the live tensor
    back = decode(out, None, {}, "meta", "x")  # tensors go to the decoder's device
    assert back["t"].device.type == "meta" and back["t"].requires_grad
    again = decode(out, None, {}, "cpu", "x")
    with torch.no_grad():
        again["t"].add_(5.0)  # a state kept in memory (a parked client's) is restored again later: a copy
    assert out["t"].tolist() == [1.0, 1.0] and decode(out, None, {}, "cpu", "x")["t"].tolist() == [1.0, 1.0]
    gen = torch.Generator().manual_seed(3)
    saved = encode({"gen": gen}, {}, "x")
    back = decode(saved, None, {}, "meta", "x")  # a CPU stream stays on the CPU wherever the tensors go
    assert back["gen"].device.type == "cpu"
    assert torch.equal(torch.rand(2, generator=back["gen"]), torch.rand(2, generator=gen))


def test_an_object_with_only_one_of_the_two_state_methods_is_saved_by_its_attributes():
    class Reporter:  # reports a summary, but cannot be loaded from it
        def __init__(self, n):
            self.n = n

        def state_dict(self):
            return {"summary": "n"}

    class Owner2:
        def __init__(self, n):
            self.rep = Reporter(n)

    fresh = Owner2(0)
    decode_attrs(fresh, encode_attrs(Owner2(4), {}), {}, "cpu")
    assert fresh.rep.n == 4


def test_a_module_the_fresh_object_lacks_is_built_by_new_module(tmp_path):
    cfg = object()
    o = trained(cfg)
    o.previous = nn.Linear(3, 4)
    saved = encode_attrs(o, {id(cfg): "cfg"})
    fresh = Owner(cfg, 2)
    made = []
    decode_attrs(fresh, saved, {"cfg": cfg}, "cpu", "owner",
                 new_module=lambda name: made.append(name) or nn.Linear(3, 4))
    assert made == ["previous"] and torch.equal(fresh.previous.weight, o.previous.weight)
    with pytest.raises(StateError, match=r"^owner\.previous: a module this object does not hold$"):
        decode_attrs(Owner(cfg, 2), saved, {"cfg": cfg}, "cpu", "owner")


def test_what_cannot_be_saved_is_refused_with_its_path():
    class Holder:
        def __init__(self):
            self.ok = 1
            self.fn = lambda: 0

    with pytest.raises(StateError, match=r"^Holder\.fn: a .*function.* cannot be saved as data"):
        encode_attrs(Holder(), {})
    assert "fn" not in encode_attrs(Holder(), {}, skip=("fn",))  # what a checkpoint skips
    with pytest.raises(StateError, match=r"^x\[0\]: a numpy array of Python objects cannot be saved"):
        encode([np.array([object()])], {}, "x")


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.update(model=3), r"owner\.model: a Module in this run, a int in the saved state"),
    (lambda s: s.update(gen="seed"), r"owner\.gen: a Generator in this run, a str in the saved state"),
    (lambda s: s["model"]["state"].update({"0.weight": torch.zeros(9)}), r"owner\.model: Error\(s\) in loading"),
    (lambda s: s["model"]["state"].update({"0.weight": {state.KIND: "pickle"}}),
     r"owner\.model\['0\.weight'\]: unknown entry kind 'pickle'$"),
    (lambda s: s["model"].update(training=[True]), r"owner\.model: 1 submodules saved, the model has 4"),
    (lambda s: s["model"].pop("frozen"), r"owner\.model: damaged module entry"),
    (lambda s: s["model"].update(training=[1] * len(s["model"]["training"])), r"owner\.model: damaged module entry"),
    (lambda s: s["model"].update(frozen=[0]), r"owner\.model: damaged module entry"),
    (lambda s: s.update(cfg={state.KIND: "link", "key": "other"}), r"owner\.cfg: the run's cfg comes from the flags and the split"),
    (lambda s: s.update(x={state.KIND: "pickle"}), r"owner\.x: unknown entry kind 'pickle'"),
    (lambda s: s.update(x=object.__new__(Counter)), r"owner\.x: unexpected Counter"),
    (lambda s: s["gen"].update(state=torch.zeros(3, dtype=torch.uint8)), r"owner\.gen: not a generator state"),
    (lambda s: s["seen"]["items"].append({state.KIND: "pickle"}), r"owner\.seen: unknown entry kind 'pickle'$"),
    (lambda s: s["counter"]["state"].update(count={state.KIND: "pickle"}),
     r"owner\.counter\['count'\]: unknown entry kind 'pickle'$"),
    (lambda s: s["rng"]["state"].update(bit_generator="Evil"), r"owner\.rng: unknown numpy bit generator 'Evil'"),
    (lambda s: s["rng"]["state"].update(state={"state": -5, "inc": 1}), r"owner\.rng: not a PCG64 state"),
    (lambda s: s["rng"]["state"].update(state=None), r"owner\.rng: damaged numpy_generator entry"),
    (lambda s: s["counter"].update(type="builtins.dict"),
     r"owner\.counter: saved a builtins\.dict, this object holds a "),
    (lambda s: s["inner"].update(type="test_state.Counter"), r"owner\.inner: saved a test_state\.Counter"),
    (lambda s: s.update(gone={state.KIND: "object", "type": "test_state.Inner", "attrs": {}}),
     r"owner\.gone: saved a test_state\.Inner, this object holds nothing"),
    (lambda s: s["inner"].update(attrs=[1]), r"owner\.inner: expected the attributes of a Inner, found list"),
    (lambda s: s["inner"]["attrs"].update({3: 1}), r"owner\.inner: attribute name '3' is not an attribute name"),
    (lambda s: s["opt"].update(state={"state": {}, "param_groups": []}), r"owner\.opt: "),
])
def test_a_state_that_does_not_fit_is_refused_with_the_attributes_path(damage, message):
    cfg = object()
    saved = encode_attrs(trained(cfg), {id(cfg): "cfg"})
    damage(saved)
    with pytest.raises(StateError, match="^" + message):
        decode_attrs(Owner(cfg, 2), saved, {"cfg": cfg}, "cpu", "owner")


def behaviour():
    return 0


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("live, saved", [
    (1.5, 2), (1.5, 2.5), (3, 4), (True, False), ("a", "b"), (b"a", b"b"), (None, 5), (5, None),
    ([1], [2]), ((1,), encode((2,), {}, "x")), ({"a": 1}, {"a": 2}), ({1}, encode({3}, {}, "x")),
    (frozenset({1}), encode(frozenset({3}), {}, "x")), (np.zeros(2), encode(np.ones(2), {}, "x")),
    (torch.device("cpu"), encode(torch.device("cpu"), {}, "x")), (RNG, encode(np.random.default_rng(1), {}, "x")),
    (np.float32(1), encode(np.float32(2), {}, "x")), (torch.zeros(2), torch.ones(2)),
])
def test_a_saved_value_of_the_live_values_kind_is_accepted(live, saved):
    """A number for a float (an integer included), an integer for an integer, a bool for a bool, text for
    text, bytes for bytes; None on either side; each structured kind for its own."""
    decode(saved, live, {}, "cpu", "x")


@pytest.mark.parametrize("live, saved, message", [
    (1.5, True, "a float in this run, a bool in the saved state"),
    (1.5, "1", "a float in this run, a str in the saved state"),
    (3, 3.0, "a int in this run, a float in the saved state"),
    (3, True, "a int in this run, a bool in the saved state"),
    (True, 1, "a bool in this run, a int in the saved state"),
    ("a", b"a", "a str in this run, a bytes in the saved state"),
    (b"a", "a", "a bytes in this run, a str in the saved state"),
    ([1], (1,), "a list in this run, a tuple in the saved state"),
    ((1,), [1], "a tuple in this run, a list in the saved state"),
    ({"a": 1}, [1], "a dict in this run, a list in the saved state"),
    ({"a": 1}, encode({1}, {}, "x"), "a dict in this run, a set in the saved state"),
    ({1}, encode(frozenset({1}), {}, "x"), "a set in this run, a frozenset in the saved state"),
    ({1}, [1], "a set in this run, a list in the saved state"),
    (frozenset({1}), encode({1}, {}, "x"), "a frozenset in this run, a set in the saved state"),
    (np.zeros(2), [0.0, 0.0], "a ndarray in this run, a list in the saved state"),
    (torch.device("cpu"), "cpu", "a device in this run, a str in the saved state"),
    (RNG, encode(np.float32(2), {}, "x"), "a Generator in this run, a numpy_scalar in the saved state"),
    (np.float32(1), 1.0, "a float32 in this run, a float in the saved state"),
    (behaviour, 3, r"this run holds behaviour \(a function\) there"),
    (len, 3, r"this run holds behaviour \(a builtin_function_or_method\) there"),
])
def test_a_saved_value_of_another_kind_is_refused_with_both_kinds(live, saved, message):
    with pytest.raises(StateError, match=f"^x: {message}$"):
        decode(saved, live, {}, "cpu", "x")


class Thing:
    """Behaviour of every kind a saved attribute must not replace, and a class-level default it may."""
    limit = 3  # a plain class attribute: an instance value may stand in front of it
    scorer = functools.partial(max)  # callable, no __get__

    def __init__(self, shadowed: bool = False):
        self.count = 0
        if shadowed:
            self.step = 0  # an instance attribute already in front of the method

    def step(self):
        return 1

    @property
    def size(self):
        return 2

    @staticmethod
    def make():
        return Thing()


@pytest.mark.parametrize("name", ["step", "size", "make", "scorer"])
def test_a_saved_attribute_never_replaces_behaviour(name):
    with pytest.raises(StateError, match=rf"^thing\.{name}: a saved value would replace a method or property of "
                                         rf"Thing$"):
        decode_attrs(Thing(), {name: 1}, {}, "cpu", "thing")


def test_a_saved_attribute_may_stand_where_an_instance_value_or_a_plain_default_does():
    thing = Thing(shadowed=True)
    decode_attrs(thing, {"step": 2, "limit": 5, "count": 7}, {}, "cpu", "thing")
    assert (vars(thing)["step"], thing.limit, thing.count, Thing.limit) == (2, 5, 7, 3)


@pytest.mark.parametrize("name", ["__class__", "__dict__", "a b", "9lives", "x.y", "", "é-" + "z" * 60])
def test_a_saved_attribute_name_must_be_an_attribute_name(name):
    with pytest.raises(StateError, match=rf"^thing: attribute name {re.escape(repr(name[:40]))} is not an attribute "
                                         rf"name$"):
        decode_attrs(Thing(), {name: 1}, {}, "cpu", "thing")
    decode_attrs(Thing(), {"_private": 1, "z" * 60: 2}, {}, "cpu", "thing")  # any identifier but a dunder


@pytest.mark.parametrize("saved, ok", [(4, True), (5, False), (4.0, False), (True, False), ("4", False)])
def test_a_fixed_attribute_is_the_runs_only_with_its_type_and_value(saved, ok):
    thing = Thing()
    thing.count = 4
    if ok:
        decode_attrs(thing, {"count": saved}, {}, "cpu", "thing", fixed=("count",))
    else:
        with pytest.raises(StateError, match=rf"^thing\.count: saved {re.escape(repr(str(saved)))}, this run's is 4 \(a "
                                             rf"state of another client or run\)$"):
            decode_attrs(thing, {"count": saved}, {}, "cpu", "thing", fixed=("count",))


def test_none_may_stand_where_a_round_cleared_a_structured_value():
    cfg = object()
    o = trained(cfg)
    o.model = None
    fresh = Owner(cfg, 2)
    decode_attrs(fresh, encode_attrs(o, {id(cfg): "cfg"}), {"cfg": cfg}, "cpu", "owner")
    assert fresh.model is None


def test_a_changed_or_cut_file_fails_its_checksum(tmp_path):
    path = tmp_path / "s.pt"
    state.write_file({"w": torch.arange(6.0)}, path)
    assert state.read_file(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    data = path.read_bytes()
    assert data[64:65] == b"\n" and len(data[:64]) == 64
    for bad in (data[:-1] + bytes([data[-1] ^ 1]), data[:100], data[:64] + b" " + data[65:]):
        path.write_bytes(bad)
        with pytest.raises(StateError, match="checksum does not match"):
            state.read_file(path)


def test_map_tensors_reaches_every_tensor_of_a_tree():
    tree = {"a": torch.ones(1), "b": [torch.zeros(1), ("x", torch.full((1,), 2.0))], "c": 5}
    out = map_tensors(tree, lambda t: t + 10)
    assert out["a"].tolist() == [11.0] and out["b"][0].tolist() == [10.0] and out["b"][1][1].tolist() == [12.0]
    assert type(out["b"][1]) is tuple and out["b"][1][0] == "x" and out["c"] == 5


def test_first_line():
    assert state.first_line(RuntimeError("one\ntwo")) == "one"
    assert state.first_line(KeyError()) == "KeyError"


def test_modules_inside_lists_and_tuples_load_into_the_live_ones():
    class Box:
        def __init__(self, seed):
            torch.manual_seed(seed)
            self.parts = (nn.Linear(2, 2), 3)
            self.stack = [nn.Linear(2, 1)]
            self.heads = {"a": nn.Linear(1, 2)}

    fresh = Box(2)
    in_tuple, in_list, in_dict = fresh.parts[0], fresh.stack[0], fresh.heads["a"]
    decode_attrs(fresh, encode_attrs(Box(1), {}), {}, "cpu")
    assert fresh.parts[0] is in_tuple and fresh.stack[0] is in_list and fresh.heads["a"] is in_dict
    assert fresh.parts[1] == 3
    assert torch.equal(in_tuple.weight, Box(1).parts[0].weight) and torch.equal(in_list.bias, Box(1).stack[0].bias)
    assert torch.equal(in_dict.weight, Box(1).heads["a"].weight)


def test_decode_puts_a_value_onto_the_live_one_and_names_its_path():
    torch.manual_seed(0)
    saved = encode(nn.Linear(2, 3), {}, "m")
    live = nn.Linear(2, 3)
    assert decode(saved, live, {}, "cpu", "recorder.m") is live
    assert torch.equal(live.weight, saved["state"]["weight"])
    with pytest.raises(StateError, match=r"^recorder\.m: a module this object does not hold"):
        decode(saved, None, {}, "cpu", "recorder.m")


def test_a_numpy_stream_is_set_on_the_live_generator_or_rebuilt_for_another_bit_generator():
    saved = encode(np.random.default_rng(3), {}, "rng")  # PCG64
    expected = np.random.default_rng(3).random(3)
    same = np.random.default_rng(9)
    assert decode(saved, same, {}, "cpu", "rng") is same and np.array_equal(same.random(3), expected)
    other = np.random.Generator(np.random.MT19937(9))
    out = decode(saved, other, {}, "cpu", "rng")
    assert out is not other and type(out.bit_generator).__name__ == "PCG64"
    assert np.array_equal(out.random(3), expected)
    assert np.array_equal(decode(saved, None, {}, "cpu", "rng").random(3), expected)


def test_a_device_is_the_runs_own_where_the_fresh_object_holds_one():
    class Placed:
        def __init__(self, device):
            self.device = device

    saved = encode_attrs(Placed(torch.device("cuda", 1)), {})  # saved on a GPU run: only its name is kept
    fresh = Placed(torch.device("cpu"))
    decode_attrs(fresh, saved, {}, "cpu")
    assert fresh.device == torch.device("cpu")  # resumed on the CPU: the run's own device stays
    empty = Placed(None)
    decode_attrs(empty, saved, {}, "cpu")
    assert empty.device == torch.device("cuda", 1)  # nothing there: the saved one


def test_a_linked_object_is_named_by_its_kind_alone():
    """A link's key is kind:name ("client:3"); the message names the kind."""
    client, thing = object(), Thing()
    thing.peer = client
    with pytest.raises(StateError, match=r"^thing\.peer: the run's client comes from the flags and the split; the "
                                         r"saved state puts something else there$"):
        decode_attrs(thing, {"peer": 5}, {"client:3": client}, "cpu", "thing")


def test_a_fixed_attributes_long_saved_value_is_cut_to_40_characters():
    thing = Thing()
    thing.count = 4
    with pytest.raises(StateError, match=rf"^thing\.count: saved {'abcdefghij' * 4!r}, this run's is 4 "):
        decode_attrs(thing, {"count": "abcdefghij" * 6}, {}, "cpu", "thing", fixed=("count",))


def test_a_state_file_goes_only_into_a_folder_that_exists(tmp_path):
    from utils.fileio import FileIOError

    with pytest.raises(FileIOError, match="missing is not a folder the run can use"):
        state.write_file({"a": 1}, tmp_path / "missing" / "s.pt")
    assert not (tmp_path / "missing").exists()


def test_a_state_file_nested_deeper_than_the_limit_is_refused(tmp_path):
    from utils.fileio import MAX_DEPTH

    def nested(levels):  # a list in a list ... ``levels`` deep
        v: list = []
        for _ in range(levels - 1):
            v = [v]
        return v

    state.write_file(nested(MAX_DEPTH), tmp_path / "ok.pt")
    assert state.read_file(tmp_path / "ok.pt") == nested(MAX_DEPTH)
    state.write_file(nested(MAX_DEPTH + 1), tmp_path / "deep.pt")
    with pytest.raises(StateError, match=f"^it is nested more than {MAX_DEPTH} levels deep$"):
        state.read_file(tmp_path / "deep.pt")
