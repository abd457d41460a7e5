"""ALA against hand computations and the paper's own statements."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.trainmodel.parts import adapted_names
from utils.ALA import ALA, combine, converged, weight_step
from utils.errors import FLError
from utils.results import read_h5
from runtime import loop


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.fc1(x)))


class TinyBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 3)
        self.bn = nn.BatchNorm1d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.fc1(x))))


def bn_pair():
    """Two BatchNorm models whose weights and running statistics all differ."""
    torch.manual_seed(7)
    glob, local = TinyBN(), TinyBN()
    with torch.no_grad():
        glob.bn.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0]))
        glob.bn.running_var.copy_(torch.tensor([4.0, 5.0, 6.0]))
        glob.bn.num_batches_tracked.fill_(9)
        local.bn.running_mean.copy_(torch.tensor([-1.0, 0.5, -2.0]))
        local.bn.running_var.copy_(torch.tensor([0.5, 2.0, 3.0]))
    return glob, local


def pair(seed=0):
    torch.manual_seed(seed)
    return Tiny(), Tiny()


def test_one_weight_step_matches_hand_computation():
    glob, local = pair()
    x, y = torch.tensor([[1.0, -2.0]]), torch.tensor([1])
    ala = ALA(adapted_names(local, 1), eta=0.5, rand_percent=100, batch_size=1)
    ala.start_phase = False
    ref_local, ref_glob = copy.deepcopy(local), copy.deepcopy(glob)
    ala.adaptive_local_aggregation(glob, local, x, y)
    # by hand: at W = 1 the blended head is the global head, dL/dW = (Θ - Θ_i) * dL/dΘ̂
    probe = copy.deepcopy(ref_glob)
    nn.functional.cross_entropy(probe(x), y).backward()
    for name in ("fc.weight", "fc.bias"):
        g_theta = dict(probe.named_parameters())[name].grad
        diff = dict(ref_glob.named_parameters())[name] - dict(ref_local.named_parameters())[name]
        w = (1 - 0.5 * diff * g_theta).clamp(0, 1)
        expect = dict(ref_local.named_parameters())[name] + diff * w
        assert torch.allclose(ala.weights[name], w.detach(), atol=1e-6)
        assert torch.allclose(dict(local.named_parameters())[name], expect.detach(), atol=1e-6)


def test_weights_stay_in_unit_interval_and_lower_layers_equal_global():
    glob, local = pair(1)
    x, y = torch.randn(50, 2), torch.randint(0, 2, (50,))
    ala = ALA(adapted_names(local, 1), eta=50.0, rand_percent=80, batch_size=5, max_epochs=5)
    ala.adaptive_local_aggregation(glob, local, x, y)
    for w in ala.weights.values():
        assert w.min() >= 0 and w.max() <= 1
    assert any(((w > 0) & (w < 1)).any() or (w == 0).any() for w in ala.weights.values())
    assert torch.equal(local.fc1.weight, glob.fc1.weight) and torch.equal(local.fc1.bias, glob.fc1.bias)


def test_knowl3_identity_unclipped_step_scales_gradient_by_squared_difference():
    glob, local = pair(2)
    x, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
    names = [n for n, _ in local.named_parameters()]  # p = all layers
    assert adapted_names(local, 0) == names
    lp, gp = dict(local.named_parameters()), dict(glob.named_parameters())
    w = {n: torch.rand_like(lp[n]).requires_grad_(True) for n in names}
    theta_hat = {n: combine(lp[n].detach(), gp[n].detach(), w[n]) for n in names}
    loss = nn.functional.cross_entropy(torch.func.functional_call(local, theta_hat, (x,)), y)
    grads_w = torch.autograd.grad(loss, [w[n] for n in names])
    th = {n: t.detach().requires_grad_(True) for n, t in theta_hat.items()}
    loss2 = nn.functional.cross_entropy(torch.func.functional_call(local, th, (x,)), y)
    grads_th = torch.autograd.grad(loss2, [th[n] for n in names])
    eta = 0.3
    for n, gw, gt in zip(names, grads_w, grads_th):
        diff = (gp[n] - lp[n]).detach()
        after_w_step = combine(lp[n].detach(), gp[n].detach(), weight_step(w[n].detach(), gw, eta, clip=False))
        assert torch.allclose(after_w_step, theta_hat[n].detach() - eta * diff * diff * gt, atol=1e-6)


def test_start_phase_stops_at_cap_then_one_epoch():
    glob, local = pair(3)
    x, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    ala = ALA(adapted_names(local, 1), threshold=0.0, window=3, max_epochs=7, batch_size=10)
    ala.adaptive_local_aggregation(glob, local, x, y)
    assert ala.last_epochs == 7 and not ala.start_phase  # threshold 0 never converges: the cap ends it
    ala.adaptive_local_aggregation(glob, local, x, y)
    assert ala.last_epochs == 1


def test_convergence_rule():
    assert not converged([1.0, 1.0], window=3, threshold=0.1)
    assert not converged([1.0, 1.0, 1.0], window=3, threshold=0.1)  # PFLlib needs more than `window` losses
    assert converged([5.0, 1.0, 1.01, 1.02], window=3, threshold=0.1)
    assert not converged([1.0, 2.0, 3.0, 4.0], window=3, threshold=0.1)
    # strict, as PFLlib's `np.std(...) < threshold`: the std of [0, 1] is 0.5 exactly
    assert not converged([9.0, 0.0, 1.0], window=2, threshold=0.5)
    assert converged([9.0, 0.0, 1.0], window=2, threshold=0.5 + 1e-9)


def test_start_phase_with_constant_losses_stops_after_window_plus_one_epochs():
    glob, local = pair(3)
    x, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    ala = ALA(adapted_names(local, 1), eta=0.0, rand_percent=100, threshold=0.1, window=3, max_epochs=50,
              batch_size=10)  # eta 0: W stays at ones, every epoch's mean loss is the same
    ala.adaptive_local_aggregation(glob, local, x, y)
    assert ala.last_epochs == 4


def test_constructor_defaults_are_the_papers_and_the_flags():
    """ALA built directly (a researcher's own loop) behaves as `-algo FedALA` does by default: η = 1.0 and
    s = 80 % (the paper), PFLlib's start-phase rule (std < 0.1 over 10 epochs), a cap of 100 epochs, batch
    10, nothing kept for the train-loss evaluation, the whole model run per batch, the global buffers."""
    ala = ALA(["fc.weight"])
    got = (ala.eta, ala.rand_percent, ala.threshold, ala.window, ala.max_epochs, ala.batch_size)
    assert got == (1.0, 80, 0.1, 10, 100, 10)
    cfg = parse_config(["-algo", "FedALA"])
    assert got == (cfg.eta, cfg.rand_percent, cfg.ala_threshold, cfg.ala_window, cfg.ala_max_epochs, cfg.batch_size)
    assert (ala.keep_features, ala.head, ala.global_buffers) == (False, None, True)


def test_the_sample_is_s_percent_of_the_indices_from_the_clients_own_stream():
    def perm(n, seed):
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))

    # int(20 * 30 / 100) = 6 indices, from the given stream, which advances: a new sample each round
    ala = ALA(["fc.weight"], rand_percent=30, generator=torch.Generator().manual_seed(5))
    first, again = ala.sample(20), ala.sample(20)
    g = torch.Generator().manual_seed(5)
    assert torch.equal(first, torch.randperm(20, generator=g)[:6])
    assert torch.equal(again, torch.randperm(20, generator=g)[:6]) and not torch.equal(first, again)
    # without a stream of its own: one seeded 0, not the global generator
    torch.manual_seed(123)
    assert torch.equal(ALA(["fc.weight"], rand_percent=30).sample(20), perm(20, 0)[:6])
    assert len(ALA(["fc.weight"], rand_percent=10, generator=torch.Generator()).sample(1000)) == 100
    assert len(ALA(["fc.weight"], rand_percent=1, generator=torch.Generator()).sample(5)) == 1  # at least one


@pytest.mark.parametrize("flags, keep", [
    ((), True),  # every round evaluates the train loss in fp32: ALA keeps the classifier's inputs for it
    (("--train_loss_eval", "sampled"), True),
    (("--train_loss_eval", "off"), False),  # nothing would read them
    (("-eg", "2"), False),  # every sample's inputs in each round, read in every other: they cost more than they save
    (("--amp", "bf16"), False),  # the evaluation runs in bf16: fp32 inputs would change its figure
])
def test_kept_features_only_where_this_rounds_train_loss_evaluation_reads_them(flags, keep):
    cfg = parse_config(["-algo", "FedALA", *flags])
    assert ALA.from_config(cfg, cid=0, run=0, names=["fc.weight"], head="fc").keep_features is keep


def test_from_config_takes_each_flag_into_its_own_field():
    """Every value distinct, so two flags trading places shows."""
    from utils.seeding import derive_seed

    cfg = parse_config(["-algo", "FedALA", "-et", "0.7", "-s", "37", "--ala_threshold", "0.03",
                             "--ala_window", "4", "--ala_max_epochs", "9", "-lbs", "13", "--seed", "5"])
    ala = ALA.from_config(cfg, cid=3, run=2, names=["fc.weight"], head="fc")
    assert (ala.eta, ala.rand_percent, ala.threshold, ala.window, ala.max_epochs, ala.batch_size, ala.head) \
        == (0.7, 37, 0.03, 4, 9, 13, "fc")
    assert ala.generator.initial_seed() == derive_seed(5, 2, "ala", 3)  # the client's own stream of this run
    assert ala.global_buffers  # --bn_stats shared: Θ̂ takes the global model's buffers
    local = ALA.from_config(parse_config(["-algo", "FedALA", "--bn_stats", "local"]), 0, 0, ["fc.weight"])
    assert not local.global_buffers and local.head is None


@pytest.mark.parametrize("global_buffers", [True, False])
def test_batchnorm_statistics_come_from_the_global_model_or_stay_local_and_the_global_model_is_untouched(
        global_buffers):
    glob, local = bn_pair()
    before_glob, before_local = copy.deepcopy(glob.state_dict()), copy.deepcopy(local.state_dict())
    x, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    ala = ALA(adapted_names(local, 1), rand_percent=100, batch_size=8, max_epochs=3, global_buffers=global_buffers,
              generator=torch.Generator().manual_seed(1))
    local.train()  # train-mode forwards update the running statistics they are given
    ala.adaptive_local_aggregation(glob, local, x, y)
    assert all(torch.equal(before_glob[k], v) for k, v in glob.state_dict().items())
    want = before_glob if global_buffers else before_local
    for k in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        assert torch.equal(local.state_dict()[k], want[k]), k
    assert torch.equal(local.fc1.weight, glob.fc1.weight)  # lower layers from the global model either way


def test_the_forward_passes_use_the_global_statistics_unless_kept_local():
    """In eval mode the statistics shape the loss W learns from: with the global ones, W is what it would
    be for a local model that already held them (and not what the local statistics give)."""
    def weights(global_buffers, local):
        glob = bn_pair()[0]
        local.eval()
        ala = ALA(adapted_names(local, 1), rand_percent=100, batch_size=8, max_epochs=2,
                  global_buffers=global_buffers, generator=torch.Generator().manual_seed(1))
        ala.adaptive_local_aggregation(glob, local, x, y)
        return ala.weights

    x, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    glob, local = bn_pair()
    holding = copy.deepcopy(local)
    holding.load_state_dict({**local.state_dict(), **{k: v for k, v in glob.state_dict().items() if "bn.running" in k
                                                      or "num_batches" in k}})
    shared, own, reference = weights(True, copy.deepcopy(local)), weights(False, copy.deepcopy(local)), \
        weights(False, holding)
    assert all(torch.equal(shared[k], reference[k]) for k in shared)
    assert not all(torch.equal(shared[k], own[k]) for k in shared)


def test_when_only_the_classifier_is_adapted_the_lower_layers_run_once_per_round():
    """The fast path (``head``): the frozen lower layers' outputs are computed once, in one no-grad pass of
    the global model over the sample (30 < FEATURE_BATCH samples), instead of in each of the 4 epochs x 6
    batches of W steps; without ``head`` every step runs the whole model."""
    def lower_layer_calls(head):
        glob, local = pair(5)
        calls = []
        for name, model in (("global", glob), ("local", local)):
            model.fc1.register_forward_hook(lambda m, a, o, name=name: calls.append(name))
        ala = ALA(adapted_names(local, 1), rand_percent=100, batch_size=5, threshold=0.0, window=2, max_epochs=4,
                  head=head, generator=torch.Generator().manual_seed(0))
        ala.adaptive_local_aggregation(glob, local, torch.randn(30, 2), torch.randint(0, 2, (30,)))
        assert ala.last_epochs == 4
        return calls

    assert lower_layer_calls("fc") == ["global"]
    assert lower_layer_calls(None) == ["local"] * 24


def test_a_last_batch_of_one_joins_the_one_before_only_where_batchnorm_would_see_it():
    """31 samples in batches of 5: 6 batches and a last one of a single sample, which a train-mode
    BatchNorm cannot normalise; it joins the batch before only where the whole model, with BatchNorm, runs."""
    def steps(models, head):
        glob, local = models
        calls = []
        local.fc.register_forward_hook(lambda *a: calls.append(1))
        ala = ALA(adapted_names(local, 1), rand_percent=100, batch_size=5, head=head,
                  generator=torch.Generator().manual_seed(0))
        ala.start_phase = False  # one epoch
        local.train()
        ala.adaptive_local_aggregation(glob, local, torch.randn(31, 2), torch.randint(0, 2, (31,)))
        return len(calls)

    assert steps(pair(6), "fc") == 7  # the classifier alone
    assert steps(pair(6), None) == 7  # the whole model, without BatchNorm
    assert steps(bn_pair(), None) == 6  # with BatchNorm


def test_the_epoch_loss_is_the_mean_batch_loss_and_no_hook_is_left_behind():
    glob, local = pair(8)
    x, y = torch.randn(12, 2), torch.randint(0, 2, (12,))
    # η = 0 keeps W at ones, so every batch is scored by the global model: two batches of 6
    ala = ALA(adapted_names(local, 1), eta=0.0, rand_percent=100, batch_size=6, head="fc",
              generator=torch.Generator().manual_seed(0))
    ala.start_phase = False
    ala.adaptive_local_aggregation(glob, local, x, y)
    with torch.no_grad():
        per_sample = nn.functional.cross_entropy(glob(x), y, reduction="none")
    # two batches of equal size, in whatever order: the mean of their means is the mean over the 12
    assert ala.last_losses == pytest.approx([float(per_sample.mean())], rel=1e-6)
    one = ALA(adapted_names(local, 1), eta=0.0, rand_percent=100, batch_size=12, generator=torch.Generator())
    one.start_phase = False
    one.adaptive_local_aggregation(glob, copy.deepcopy(local), x, y)
    assert one.last_losses == pytest.approx([float(per_sample.mean())], rel=1e-6)  # one batch: its own loss
    assert not glob.fc._forward_hooks and not local.fc._forward_hooks  # the capture hook was removed


def test_same_seed_same_weights():
    outs = []
    for _ in range(2):
        glob, local = pair(4)
        x, y = torch.randn(30, 2), torch.randint(0, 2, (30,), generator=torch.Generator().manual_seed(0))
        ala = ALA(adapted_names(local, 1), generator=torch.Generator().manual_seed(9), max_epochs=3)
        ala.adaptive_local_aggregation(glob, local, x, y)
        outs.append(ala.weights)
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


def test_ala_layers_count_layers_and_p_counts_tensors():
    """--ala_layers counts the paper's layers; -p counts parameter tensors from the top, as PFLlib's -p
    (whose default 2 is the paper's p = 1 on these models: the classifier's weight and bias)."""
    from flcore.trainmodel.models import build_model
    from flcore.trainmodel.parts import ala_names

    cnn = build_model("CNN", (1, 28, 28), 10)
    assert adapted_names(cnn, 1) == ["fc.weight", "fc.bias"]
    assert adapted_names(cnn, 2) == ["fc1.0.weight", "fc1.0.bias", "fc.weight", "fc.bias"]
    # ResNet-18 counts stages, as the paper's sensitivity table (Tiny-ImageNet, its Knowl 7): the parameters
    # ALA adapts for p = 1..6 are 0.005M, 8.399M, 10.499M, 11.024M, 11.172M, 11.182M (the fc there has
    # 10 outputs' worth: 5,130 = 512 * 10 + 10).
    resnet = build_model("ResNet18", (3, 32, 32), 10)
    sizes = dict((n, p.numel()) for n, p in resnet.named_parameters())
    counts = [sum(sizes[n] for n in adapted_names(resnet, p)) for p in range(1, 7)]
    assert [round(c / 1e6, 3) for c in counts] == [0.005, 8.399, 10.499, 11.024, 11.172, 11.182]
    assert adapted_names(resnet, 0) == list(sizes)
    with pytest.raises(FLError, match="--ala_layers 7: the model has 6 layer"):
        adapted_names(resnet, 7)
    with pytest.raises(FLError):
        adapted_names(cnn, 5)
    # -p: tensors. The CNN's are conv1 (w, b), conv2 (w, b), fc1 (w, b), fc (w, b).
    names = [n for n, _ in cnn.named_parameters()]
    assert ala_names(cnn, 2) == ["fc.weight", "fc.bias"] == ala_names(cnn, 2, None) == ala_names(cnn, 99, 1)
    assert ala_names(cnn, 1) == ["fc.bias"] and ala_names(cnn, 3) == names[-3:] and ala_names(cnn, 0) == names
    assert ala_names(resnet, 2) == ["fc.weight", "fc.bias"]  # PFLlib's default: the classifier only
    with pytest.raises(FLError, match="-p 9: the model has 8 parameter tensors"):
        ala_names(cnn, 9)


def test_round_one_leaves_local_model_as_global(digits_root):
    from flcore.servers.serverala import FedALAServer
    from utils.data_utils import load_split

    cfg = parse_config(cli(digits_root, digits_root, "-algo", "FedALA", "--executor", "sequential")).replace(device="cpu", num_classes=10)
    server = FedALAServer(cfg, load_split("Digits", digits_root))
    client = server.clients[0]
    before = copy.deepcopy(client.model.state_dict())
    loop.send(server, server.clients)
    assert client.ala.weights is None and client.ala.start_phase  # ALA did not run
    assert (client.ala.last_epochs, client.ala.last_losses) == (0, [])  # and reports no epoch
    assert all(torch.equal(before[k], v) for k, v in client.model.state_dict().items())


def test_fedavg_with_ala_equals_fedala(digits_noniid_root, tmp_path):
    args = ("-gr", "3", "-lr", "0.1")
    assert main.main(cli(digits_noniid_root, tmp_path, "-algo", "FedALA", *args)) == 0
    assert main.main(cli(digits_noniid_root, tmp_path, "-algo", "FedAvg", "-ala", *args)) == 0
    a = read_h5(tmp_path / "Digits_FedALA_test_0.h5")
    b = read_h5(tmp_path / "Digits_FedAvg+ALA_test_0.h5")
    for key in ("rs_test_acc", "rs_train_loss", "rs_client_test_acc"):
        assert np.array_equal(a[key], b[key]), key


def test_fedala_beats_fedavg_on_pathological_split(digits_noniid_root, tmp_path):
    args = ("-gr", "3", "-lr", "0.1")
    assert main.main(cli(digits_noniid_root, tmp_path, "-algo", "FedALA", *args)) == 0
    assert main.main(cli(digits_noniid_root, tmp_path, "-algo", "FedAvg", *args)) == 0
    ala = read_h5(tmp_path / "Digits_FedALA_test_0.h5")["rs_test_acc"][-1]
    avg = read_h5(tmp_path / "Digits_FedAvg_test_0.h5")["rs_test_acc"][-1]
    assert ala > avg + 0.1, (ala, avg)


def test_kept_features_are_the_lower_layers_outputs_until_they_change():
    """keep_features: the classifier inputs on every training sample, valid only while the model's lower
    layers are the ones they came from."""
    glob, local = pair(3)
    x, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    ala = ALA(adapted_names(local, 1), rand_percent=50, batch_size=5, keep_features=True, head="fc")
    ala.adaptive_local_aggregation(glob, local, x, y)
    feats = ala.features_for(local)
    with torch.no_grad():
        expected = torch.relu(glob.fc1(x))  # the lower layers are the global model's after ALA
    torch.testing.assert_close(feats, expected)
    with torch.no_grad():
        local.fc.weight.add_(1.0)  # the classifier may change: the inputs stay valid
    assert ala.features_for(local) is feats
    with torch.no_grad():
        local.fc1.weight.add_(1e-3)  # a lower layer changes: they are not
    assert ala.features_for(local) is None


def test_train_loss_from_kept_features_equals_full_evaluation(digits_noniid_root, tmp_path):
    """FedALA's train loss read from the features ALA kept equals running the whole model, round by
    round (ALA's W steps see the same inputs either way, up to float rounding)."""
    from flcore.registry import get_server_class
    from utils.data_utils import load_split

    losses = {}
    for keep in (True, False):
        cfg = parse_config(cli(digits_noniid_root, tmp_path, "-algo", "FedALA", "-lr", "0.05", "--executor", "sequential",
                                    "--ala_max_epochs", "3"))
        data = load_split("Digits", digits_noniid_root, None, "cpu")
        cfg = cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients))
        server = get_server_class("FedALA")(cfg, data, 0, None)
        for c in server.clients:
            c.ala.keep_features = keep
        out = []
        for t in range(3):
            server.round_idx = t
            chosen = server.select_clients()
            loop.send(server, chosen)
            used = [c.ala.features_for(c.model) is not None for c in server.clients]
            out.append(loop.evaluate(server)["train_loss"])
            loop.train_clients(server, chosen)
            server.aggregate(loop.receive(server, chosen))
            assert all(used) == (keep and t > 0)  # ALA runs from a client's second round
        losses[keep] = out
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
