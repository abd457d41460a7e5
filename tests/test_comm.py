"""Bytes up and down per round (rs_bytes_up / rs_bytes_down): the tensors of every payload and upload
actually sent, against sizes computed by hand from the model."""
import json

import numpy as np
import torch

import main
from conftest import cli
from flcore.clients.clientbase import Upload
from flcore.trainmodel.models import build_model
from flcore.trainmodel.parts import split_head
from utils.comm import payload_bytes
from utils.results import read_h5


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


def test_fedrep_uploads_only_the_body_and_dropped_clients_upload_nothing(digits_tiny_root, tmp_path):
    h5, _ = run(digits_tiny_root, tmp_path, "FedRep", "-pls", "1", "-jr", "0.6")
    net = split_head(build_model("CNN", (1, 8, 8), 10))
    body = state_bytes(net.base.state_dict())
    assert list(h5["rs_bytes_up"]) == [3 * (body + 8)] * 2  # int(0.6 * 5) = 3 participants
    assert list(h5["rs_bytes_down"]) == [5 * state_bytes(net.state_dict())] * 2  # every client is sent the model


def test_scaffold_sends_its_control_variates(digits_tiny_root, tmp_path):
    h5, _ = run(digits_tiny_root, tmp_path, "SCAFFOLD")
    model = build_model("CNN", (1, 8, 8), 10)
    params = sum(p.nelement() * 4 for p in model.parameters())
    full = state_bytes(model.state_dict())
    assert np.array_equal(h5["rs_bytes_down"], [5 * (full + params)] * 2)  # x and c
    assert np.array_equal(h5["rs_bytes_up"], [5 * (full + 8 + params)] * 2)  # y_i, weight and Δc_i
