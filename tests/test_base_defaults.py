"""The base classes' defaults as a researcher meets them when building or driving a server or a client by
hand (a notebook, a subclass's test): run 0, a client that receives takes part in the round, ``train()`` is
round 0's, ``run_epochs`` takes its options by keyword, and ``copy_state`` copies the buffers too."""
import copy

import pytest
import torch

from cli import parse_config
from conftest import cli
from flcore.clients.clientbase import Client, copy_state
from flcore.registry import get_server_class
from flcore.trainmodel.models import build_model
from utils.data_utils import load_split
from utils.seeding import torch_gen
from runtime import client_steps


def setup(root, *flags):
    cfg = parse_config(cli(root, root, "-algo", "FedAvg", "--executor", "sequential", "-lr", "0.1", *flags))
    data = load_split("Digits", root, None, "cpu")
    return cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients)), data


def same_params(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_server_or_client_built_without_a_run_is_run_0(digits_tiny_root):
    cfg, data = setup(digits_tiny_root)
    server = get_server_class("FedAvg")
    built = server(cfg, data)
    assert built.run == 0
    assert same_params(built.global_model, server(cfg, data, 0).global_model)
    assert not same_params(built.global_model, server(cfg, data, 1).global_model)  # the run does seed it
    client = Client(cfg, 2, data.clients[2], built.global_model)
    assert client.run == 0
    assert torch.equal(client.batch_gen.get_state(), torch_gen(cfg.seed, 0, "batches", 2).get_state())


def test_a_client_that_receives_takes_part_unless_told_otherwise(digits_tiny_root):
    cfg, data = setup(digits_tiny_root, "-ala")
    client = Client(cfg, 0, data.clients[0], build_model("DNN", data.input_shape, data.num_classes))
    client_steps.train(client)  # ALA runs from a client's second round on
    other = copy.deepcopy(client.model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)

    def after(call):
        c = copy.deepcopy(client)
        call(c)
        return c.model

    taking_part = after(lambda c: c.receive(other, True))
    left_out = after(lambda c: c.receive(other, False))
    assert same_params(left_out, client.model) and not same_params(taking_part, client.model)
    assert same_params(after(lambda c: c.receive(other)), taking_part)
    assert same_params(after(lambda c: c.initialize_local(c.model, other)), taking_part)


def test_train_without_a_round_is_round_0(digits_tiny_root):
    cfg, data = setup(digits_tiny_root, "-ld", "-ldg", "0.5")
    client = Client(cfg, 0, data.clients[0], build_model("DNN", data.input_shape, data.num_classes))
    client_steps.train(client)
    assert [g["lr"] for g in client.optimizer.param_groups] == [0.1]
    client_steps.train(client, 2)
    assert [g["lr"] for g in client.optimizer.param_groups] == [0.025]


def test_run_epochs_takes_the_batch_size_either_way_and_its_options_by_keyword(digits_tiny_root):
    cfg, data = setup(digits_tiny_root)
    client = Client(cfg, 0, data.clients[0], build_model("DNN", data.input_shape, data.num_classes))
    assert isinstance(client.run_epochs(1, batch_size=16), float)
    with pytest.raises(TypeError):
        client.run_epochs(1, 16, client.optimizer)  # an optimizer given in the batch size's neighbour's place


def test_copy_state_copies_batchnorm_statistics_unless_told_not_to():
    torch.manual_seed(0)
    source, target = build_model("BNCNN", (1, 8, 8), 10), build_model("BNCNN", (1, 8, 8), 10)
    source.train()
    source(torch.randn(4, 1, 8, 8))  # running statistics that differ from the fresh target's
    own = {n: b.clone() for n, b in target.named_buffers()}
    kept = copy.deepcopy(target)
    copy_state(target, source)
    assert same_params(target, source)
    copy_state(kept, source, buffers=False)
    assert all(torch.equal(p, q) for p, q in zip(kept.parameters(), source.parameters()))
    assert all(torch.equal(b, own[n]) for n, b in kept.named_buffers())
    assert not all(torch.equal(b, own[n]) for n, b in source.named_buffers())
