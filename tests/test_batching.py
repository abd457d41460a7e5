"""Training batches: every sample once per epoch, and never a one-sample batch through BatchNorm
(ResNet-18 on 32x32 inputs sees 1x1 maps in its last stage, where one sample gives BatchNorm a single
value per channel)."""
import pytest
import torch

from cli import parse_config
from conftest import cli
from flcore.clients.clientala import FedALAClient
from flcore.clients.clientavg import FedAvgClient
from flcore.trainmodel.models import build_model
from utils.batching import batch_bounds, batches, batches_per_epoch
from utils.data_utils import ClientData
from runtime import client_steps


def test_batch_bounds_by_hand():
    assert batch_bounds(25, 10) == [(0, 10), (10, 20), (20, 25)]
    assert batch_bounds(21, 10) == [(0, 10), (10, 20), (20, 21)]
    assert batch_bounds(21, 10, merge_single=True) == [(0, 10), (10, 21)]
    assert batch_bounds(1, 10, merge_single=True) == [(0, 1)]  # nothing to merge into
    assert batch_bounds(22, 10, merge_single=True) == [(0, 10), (10, 20), (20, 22)]


def resnet_client(root, tmp_path, cls, n, *flags):
    cfg = parse_config(cli(root, tmp_path, "-m", "ResNet18", "-lbs", "10", "-lr", "0.01",
                                "--executor", "sequential", *flags)).replace(num_classes=10, num_clients=1)
    g = torch.Generator().manual_seed(0)
    data = ClientData(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g),
                      torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model("ResNet18", (3, 32, 32), 10)
    return cls(cfg, 0, data, model), model


def test_resnet18_on_32x32_trains_when_one_sample_is_left_over(digits_root, tmp_path):
    client, _ = resnet_client(digits_root, tmp_path, FedAvgClient, 21)  # 21 = 2 * 10 + 1
    sizes = [len(b) for b in batches(client, 2)]
    assert sizes == [10, 11, 10, 11] and client.steps_per_round() == 2
    client_steps.train(client, 0)  # raised "Expected more than 1 value per channel when training" with a 1-sample batch
    assert all(torch.isfinite(p).all() for p in client.model.parameters())
    plain = FedAvgClient.__new__(FedAvgClient)  # without BatchNorm nothing is merged
    plain.train_samples, plain.cfg, plain.merge_single = 21, client.cfg, False
    assert batches_per_epoch(plain) == 3


def test_ala_weight_learning_merges_a_one_sample_batch_too(digits_root, tmp_path):
    # s = 53 %: ALA's sample of 21 is int(11.13) = 11 = 10 + 1; p = 2 adapts layer4 and fc, so the whole
    # model (BatchNorm included) runs in every W step.
    client, model = resnet_client(digits_root, tmp_path, FedALAClient, 21, "-s", "53", "--ala_layers", "2",
                                  "--ala_max_epochs", "2")
    assert client.ala.head is None  # BatchNorm: no precomputed features
    client_steps.train(client, 0)
    client.receive(model, participating=True)  # ALA's start phase, in 11-sample batches
    assert client.ala.last_epochs == 2 and all(map(torch.isfinite, map(torch.tensor, client.ala.last_losses)))


def test_without_the_merge_batchnorm_fails(digits_root, tmp_path):
    """The failure the merge prevents is real: the same client with the merge switched off."""
    client, _ = resnet_client(digits_root, tmp_path, FedAvgClient, 21)
    client.merge_single = False
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        client_steps.train(client, 0)
