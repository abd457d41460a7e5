"""Bytes up and down per round (rs_bytes_up / rs_bytes_down): the tensors of every payload and upload
actually sent, against sizes computed by hand from the model."""
import json

import numpy as np
import pytest
import torch

import main
from conftest import cli, observed_name, two_observed_rounds
from flcore.clients.clientbase import Upload
from flcore.registry import ALGORITHMS
from flcore.trainmodel.models import build_model
from flcore.trainmodel.parts import split_head
from utils.comm import payload_bytes
from utils.results import read_h5
from runtime import loop


def test_payload_bytes_by_hand():
    lin = torch.nn.Linear(3, 2)  # 6 + 2 float32
    assert payload_bytes(lin) == 32
    assert payload_bytes({"model": lin, "round": 4}) == 40  # a number counts 8 bytes
    assert payload_bytes(Upload(1, 7.0, lin.state_dict(), {"dc": {"a": torch.zeros(4, dtype=torch.float64)}})) == 32 + 8 + 32
    assert payload_bytes([lin.weight, lin.weight]) == 24  # one tensor sent once
    assert payload_bytes(torch.zeros(3, dtype=torch.uint8)) == 3 and payload_bytes(None) == 0


def state_bytes(state):
    return sum(v.nelement() * v.element_size() for v in state.values())


def run(root, out, algo, *flags):
    assert main.main(cli(root, out, "-algo", algo, "-gr", "2", "--executor", "sequential", *flags)) == 0
    stem = f"Digits_{algo}_test_0"
    return read_h5(out / f"{stem}.h5"), json.loads((out / f"{stem}.json").read_text())


def test_fedavg_moves_one_model_per_client_each_way(digits_tiny_root, tmp_path):
    h5, meta = run(digits_tiny_root, tmp_path, "FedAvg")
    model = state_bytes(build_model("CNN", (1, 8, 8), 10).state_dict())
    n = 5
    assert list(h5["rs_bytes_down"]) == [n * model] * 2
    assert list(h5["rs_bytes_up"]) == [n * (model + 8)] * 2  # the state and its weight
    assert meta["bytes_up_total"] == 2 * n * (model + 8)


def test_fedrep_sends_and_uploads_only_the_body_and_dropped_clients_upload_nothing(digits_tiny_root, tmp_path):
    h5, _ = run(digits_tiny_root, tmp_path, "FedRep", "-pls", "1", "-jr", "0.6")
    net = split_head(build_model("CNN", (1, 8, 8), 10))
    body = state_bytes(net.base.state_dict())
    assert list(h5["rs_bytes_up"]) == [3 * (body + 8)] * 2  # int(0.6 * 5) = 3 participants
    assert list(h5["rs_bytes_down"]) == [5 * body] * 2  # every client is sent the body, never the server's head


@pytest.mark.parametrize("algo, flags", [("FedBABU", ("-fte", "1")), ("FedPer", ())])
def test_split_models_are_sent_only_their_shared_body(algo, flags, digits_tiny_root, tmp_path):
    h5, _ = run(digits_tiny_root, tmp_path, algo, *flags)
    body = state_bytes(split_head(build_model("CNN", (1, 8, 8), 10)).base.state_dict())
    assert list(h5["rs_bytes_down"]) == [5 * (body + (8 if algo == "FedBABU" else 0))] * 2  # FedBABU: + the round


def test_scaffold_sends_its_control_variates(digits_tiny_root, tmp_path):
    h5, _ = run(digits_tiny_root, tmp_path, "SCAFFOLD")
    model = build_model("CNN", (1, 8, 8), 10)
    params = sum(p.nelement() * 4 for p in model.parameters())
    full = state_bytes(model.state_dict())
    assert np.array_equal(h5["rs_bytes_down"], [5 * (full + params)] * 2)  # x and c
    assert np.array_equal(h5["rs_bytes_up"], [5 * (full + 8 + params)] * 2)  # y_i, weight and Δc_i


def tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.state_dict().values()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v)


def graphs_in(obj, path="client", seen=None):
    """The paths of the tensors that carry an autograd graph (a ``grad_fn``) anywhere in ``obj``: its
    tensors, modules (parameters, their gradients, buffers), optimizers' states, containers, and the
    attributes of the library's own objects it holds (a server's clients, an ALA module, a model part)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.grad_fn is not None:
            yield path
        if obj.grad is not None:
            yield from graphs_in(obj.grad, path + ".grad", seen)
    elif isinstance(obj, torch.nn.Module):
        for name, t in [*obj.named_parameters(), *obj.named_buffers()]:
            yield from graphs_in(t, f"{path}.{name}", seen)
    elif isinstance(obj, torch.optim.Optimizer):
        for i, state in enumerate(obj.state.values()):
            yield from graphs_in(state, f"{path}.state[{i}]", seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from graphs_in(v, f"{path}[{k!r}]", seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from graphs_in(v, f"{path}[{i}]", seen)
    elif type(obj).__module__.split(".")[0] in ("flcore", "utils") and hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            yield from graphs_in(v, f"{path}.{k}", seen)


def shared_run(item) -> str | None:
    """The observed rounds a test reads (tests/conftest.py's ``regroup``: one test process makes them)."""
    if item.originalname != "test_payload_tensors_own_their_storage_and_hold_no_graph":
        return None
    return observed_name(item.callspec.params["algo"])


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_payload_tensors_own_their_storage_and_hold_no_graph(algo, digits_tiny_root):
    """What the wire carries is what the bytes count: a payload tensor that is a view of a larger one
    (a row of a stacked matrix) would be pickled with its whole storage, once per client. And neither a
    broadcast nor an upload, nor what the server and its clients keep after a round, carries an autograd
    graph (a tensor computed from a parameter and not detached: SCAFFOLD's Δc_i from the trained model, a
    prototype from a forward pass), which would keep the graph alive beyond the round, move gradients
    across clients, and not cross a process boundary. Read from the rounds conftest's
    ``two_observed_rounds`` ran (tests/test_executors.py reads them too)."""
    seen = two_observed_rounds(digits_tiny_root, algo)
    assert sorted(seen.broadcasts) == list(range(5)), algo  # round 1's payload to every client
    for cid, payload in seen.broadcasts.items():
        for t in tensors_in(payload):
            assert t.untyped_storage().nbytes() == t.nelement() * t.element_size(), (algo, cid, t.shape)
            assert not t.requires_grad, (algo, cid, t.shape)
    uploads = [u for r in seen.rounds for u in r.uploads]
    assert uploads, algo
    for upload in uploads:
        for t in tensors_in([upload.state or {}, upload.extras]):
            assert not t.requires_grad, (algo, upload.id, t.shape)
    # nor does what a client or the server keeps after a round (state, models, gradients, optimizer
    # buffers): a graph kept across rounds grows with them and holds every step's activations
    assert list(graphs_in(seen.server, "server")) == [], algo
