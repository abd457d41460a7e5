"""Details of the base client that every algorithm inherits, each against a value worked out here: the mean
loss ``run_epochs`` reports, how many batches an epoch has, the training mode and time of ``train``, the
errors of a missing attribute (parked or not), validation counts, and the sampled training loss's size."""
import inspect
import math
import time

import pytest
import torch

from conftest import build_server as build
from runtime import loop
from runtime import checkpoint
from runtime import client_steps
from plugins import dp_sample
from utils.batching import batches, batches_per_epoch


def test_run_epochs_reports_the_mean_of_its_batches_losses(digits_tiny_root, tmp_path):
    """A step that reports its batch's size as the loss: two epochs of n samples in batches of 20 give
    ceil(n / 20) batches each, whose sizes average 2n / (2 ceil(n / 20)). No epoch: 0.0 and no step."""
    c = build(digits_tiny_root, tmp_path).clients[0]
    sizes = []

    def step(x, y):
        sizes.append(len(y))
        return torch.tensor(float(len(y)))

    n = c.train_samples
    assert n % 20  # a short last batch, so the mean is not simply the batch size
    mean = c.run_epochs(2, step=step)
    assert len(sizes) == 2 * math.ceil(n / 20) and sum(sizes) == 2 * n
    assert mean == pytest.approx(2 * n / len(sizes), rel=1e-12)
    sizes.clear()
    assert c.run_epochs(1, n, step=step) == n and sizes == [n]  # one batch: its own loss
    sizes.clear()
    assert c.run_epochs(0, step=step) == 0.0 and sizes == []


def test_batches_per_epoch_follows_the_batch_size_asked_for(digits_tiny_root, tmp_path):
    c = build(digits_tiny_root, tmp_path).clients[0]
    n = c.train_samples
    assert batches_per_epoch(c) == math.ceil(n / 20)  # -lbs
    assert batches_per_epoch(c, 7) == math.ceil(n / 7) != math.ceil(n / 20)
    assert [len(b) for b in batches(c, 1, 7)] == [7] * (n // 7) + ([n % 7] if n % 7 else [])
    assert c.steps_per_round() == c.cfg.local_epochs * math.ceil(n / 20)


def test_train_runs_in_training_mode_and_records_its_own_time(digits_tiny_root, tmp_path, monkeypatch):
    c = build(digits_tiny_root, tmp_path).clients[0]
    modes = []
    monkeypatch.setattr(c, "local_update", lambda r: modes.append(c.model.training))
    c.model.eval()  # as an evaluation might leave it
    start = time.perf_counter()
    client_steps.train(c, 0)
    wall = time.perf_counter() - start
    assert modes == [True] and len(c.train_time) == 1 and 0 < c.train_time[0] <= wall


def test_a_missing_attribute_is_an_attribute_error_naming_it_and_never_unparks(digits_tiny_root, tmp_path):
    server = build(digits_tiny_root, tmp_path, "--client_state", "cpu", "-jr", "0.4")
    host = server.executor.host  # the clients themselves (the server holds handles)
    live = [c for c in host.clients.values() if "parked_in" not in vars(c)]
    parked = [c for c in host.clients.values() if "parked_in" in vars(c)]
    assert live and parked
    for c in (live[0], parked[0]):
        with pytest.raises(AttributeError, match=rf"^'{type(c).__name__}' object has no attribute '__nope__'$"):
            c.__nope__  # noqa: B018
    assert "parked_in" in vars(parked[0])  # a special name is never a reason to bring a client back
    with pytest.raises(AttributeError, match=rf"^'{type(live[0]).__name__}' object has no attribute 'nope'$"):
        live[0].nope  # noqa: B018
    assert parked[0].train_samples > 0 and "parked_in" in vars(parked[0])  # kept attributes are there
    with pytest.raises(AttributeError, match="'optimizer'"):
        parked[0].optimizer  # noqa: B018  (parked: nothing brings it back implicitly)
    assert "parked_in" in vars(parked[0])
    assert server.clients[parked[0].id].optimizer is not None  # the engine's read (a handle) brings it back
    assert "parked_in" not in vars(parked[0])


def test_validation_counts_are_the_personal_models_own(digits_tiny_root, tmp_path):
    server = build(digits_tiny_root, tmp_path, "--val_ratio", "0.3")
    loop.run_round(server, 0)
    for c in server.clients:
        with torch.no_grad():
            want = int((c.model(c.x_val).argmax(1) == c.y_val).sum())
        assert client_steps.val_metrics(c) == (want, len(c.y_val)) and len(c.y_val) > 0
    assert any(0 < client_steps.val_metrics(c)[0] < len(c.y_val) for c in server.clients)  # neither none nor all right


def test_the_sampled_training_loss_takes_at_least_one_sample(digits_tiny_root, tmp_path):
    c = build(digits_tiny_root, tmp_path, "--train_loss_eval", "sampled", "--train_loss_fraction", "0.001"
              ).clients[0]
    assert 0.001 * c.train_samples < 1 and len(client_steps.train_loss_sample(c)) == 1


def test_run_epochs_options_are_keywords():
    from flcore.clients.clientbase import Client

    p = inspect.signature(Client.run_epochs).parameters
    assert all(p[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("optimizer", "objective", "generator", "step"))


@pytest.mark.optional_deps("opacus")
def test_epsilon_is_zero_without_dp_sgd_and_before_its_first_step(digits_tiny_root, tmp_path):
    plain = build(digits_tiny_root, tmp_path)
    loop.run_round(plain, 0)
    assert all(dp_sample.dp_epsilon(c, 1e-5) == 0.0 for c in plain.clients)  # trained, but without -dp
    private = build(digits_tiny_root, tmp_path, "-dp", "-dps", "1")
    assert all(dp_sample.dp_epsilon(c, 1e-5) == 0.0 for c in private.clients)  # no step taken yet
    loop.run_round(private, 0)
    assert all(dp_sample.dp_epsilon(c, 1e-5) > 0 for c in private.clients)


def test_a_parameter_a_steps_loss_does_not_reach_is_not_moved_by_momentum(digits_tiny_root, tmp_path):
    """Gradients are cleared to None before each step, so a parameter the step's loss does not reach is
    skipped by the optimizer: SGD with momentum 0.9, lr 0.1; step 1 reaches weight and bias (gradient 1 each),
    step 2 only the weight. The bias moves once, by -0.1; the weight by -0.1 then -(0.9 * 1 + 1) * 0.1."""
    c = build(digits_tiny_root, tmp_path).clients[0]
    m = torch.nn.Linear(1, 1)
    with torch.no_grad():
        m.weight.fill_(1.0)
        m.bias.fill_(1.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    calls = []

    def objective(x, y):
        calls.append(len(y))
        return m.weight.sum() + (m.bias.sum() if len(calls) == 1 else 0)

    c.run_epochs(1, math.ceil(c.train_samples / 2), optimizer=opt, objective=objective)
    assert len(calls) == 2
    assert m.bias.item() == pytest.approx(0.9, abs=1e-7)
    assert m.weight.item() == pytest.approx(1 - 0.1 - 0.19, abs=1e-7)


def test_test_metrics_by_hand(digits_tiny_root, tmp_path):
    """(correct, samples, AUC) of the personal model on the client's test split: the AUC scikit-learn's, on
    the flattened one-vs-rest decisions of the softmax over classes."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    server = build(digits_tiny_root, tmp_path)
    loop.run_round(server, 0)
    for c in server.clients:
        with torch.no_grad():
            probs = torch.softmax(c.model(c.x_test), 1).numpy()
        correct = int((probs.argmax(1) == c.y_test.numpy()).sum())
        auc = roc_auc_score(np.eye(10)[c.y_test.numpy()].ravel(), probs.ravel())
        got = client_steps.test_metrics(c)
        assert got[:2] == (correct, len(c.y_test)) and got[2] == pytest.approx(auc, abs=1e-9)


def test_a_clients_saved_state_refers_to_its_data_and_never_holds_it(digits_tiny_root, tmp_path):
    """Checkpoints and parked states hold what training changed; the data (training, test and, with
    --val_ratio, validation splits) is rebuilt from the split, so no tensor of it is in the state."""
    from runtime.state import map_tensors

    for flags in ((), ("--val_ratio", "0.3")):
        c = build(digits_tiny_root, tmp_path, *flags).clients[0]
        data = [t for t in (c.x_train, c.y_train, c.x_test, c.y_test, c.x_val, c.y_val) if t is not None]
        assert len(data) == (6 if flags else 4)
        held = []
        map_tensors(checkpoint.client_state(c), lambda t: held.append(t) or t)
        assert held and not any(t.shape == d.shape and torch.equal(t, d) for t in held for d in data)


def test_each_clients_streams_are_its_own_seeded_draws(digits_tiny_root, tmp_path):
    """--seed 3, run 1: client i's batch order and ALA sample streams are (3, 1, "batches", i) and
    (3, 1, "ala", i) (client ids and the run unequal, so a swap of the two shows)."""
    from utils.seeding import torch_gen

    server = build(digits_tiny_root, tmp_path, "-algo", "FedALA", "--seed", "3", run=1)
    for c in server.clients:
        assert torch.equal(c.batch_gen.get_state(), torch_gen(3, 1, "batches", c.id).get_state())
        assert torch.equal(c.ala.generator.get_state(), torch_gen(3, 1, "ala", c.id).get_state())


@pytest.mark.optional_deps("opacus")
def test_each_clients_dp_noise_is_its_own_seeded_stream(digits_tiny_root, tmp_path):
    from utils.seeding import torch_gen

    server = build(digits_tiny_root, tmp_path, "-dp", "-dps", "1", "--seed", "3", run=1)
    for c in server.clients:
        assert torch.equal(c.dp.generator.get_state(), torch_gen(3, 1, "dp-noise", c.id).get_state())


def test_a_clients_state_leaves_out_what_it_is_told_and_names_the_client_in_errors(digits_tiny_root, tmp_path):
    from runtime.state import StateError

    c = build(digits_tiny_root, tmp_path).clients[2]
    assert "train_time" in checkpoint.client_state(c) and "train_time" not in checkpoint.client_state(c, skip=("train_time",))
    c.helper = lambda: None  # not a tensor, a plain value or a known object: a state cannot hold it
    with pytest.raises(StateError, match=r"^client 2\.helper: "):
        checkpoint.client_state(c)


def fp16_client(root, out):
    """A client with --amp fp16's loss scaler on the CPU (main.py keeps fp16 to CUDA devices, where its autocast
    pays; the scaler's logic is the same on either), training a 1 x 1 linear layer (weight 1, bias 0) with
    plain SGD at lr 0.1."""
    c = build(root, out, "--amp", "fp16").clients[0]
    m = torch.nn.Linear(1, 1)
    with torch.no_grad():
        m.weight.fill_(1.0)
        m.bias.fill_(0.0)
    c.optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    return c, m


def test_fp16_steps_are_loss_scaled_and_the_correction_sees_true_gradients(digits_tiny_root, tmp_path):
    """Loss 2w + b: the gradients (2, 1) are computed scaled by 2^16 and unscaled before ``after_backward``
    sees them; the step is then w 1 - 0.2, b -0.1, and the scale is kept."""
    c, m = fp16_client(digits_tiny_root, tmp_path)
    seen = []
    c.loss = lambda x, y: 2 * m.weight.sum() + m.bias.sum()
    c.after_backward = lambda: seen.append((m.weight.grad.item(), m.bias.grad.item()))
    scale = c.scaler.get_scale()
    c.run_epochs(1, c.train_samples)
    assert seen == [(2.0, 1.0)] and scale == 2.0 ** 16
    assert m.weight.item() == pytest.approx(0.8) and m.bias.item() == pytest.approx(-0.1)
    assert c.scaler.get_scale() == scale


def test_an_fp16_step_whose_scaled_gradients_overflow_is_skipped_and_the_scale_halved(digits_tiny_root, tmp_path):
    c, m = fp16_client(digits_tiny_root, tmp_path)
    c.loss = lambda x, y: 1e38 * m.weight.sum() + m.bias.sum()  # times 2^16: infinite in float32
    c.run_epochs(1, c.train_samples)
    assert m.weight.item() == 1.0 and m.bias.item() == 0.0 and c.scaler.get_scale() == 2.0 ** 15


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_leaves_the_model_in_the_mode_it_was_in(training, digits_tiny_root, tmp_path):
    """An evaluation runs the model in eval mode and puts it back as it was: a personal model trained later
    through another optimizer (Ditto's) is never switched back by ``train``."""
    c = build(digits_tiny_root, tmp_path, "--val_ratio", "0.3").clients[0]
    modes = []
    c.model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    for method in ("test_metrics", "val_metrics", "train_metrics"):
        c.model.train(training)
        modes.clear()
        getattr(client_steps, method)(c)
        assert modes and not any(modes) and c.model.training is training, method


def test_a_late_joiner_receives_as_a_participant_and_fine_tunes_in_training_mode(digits_tiny_root, tmp_path,
                                                                                 monkeypatch):
    """``join_late``: the payload is received as by a participant (an algorithm whose non-participants keep
    their model, as FedAS's, would otherwise ignore it); fine-tuning runs in training mode even when the model
    was left in eval mode; no payload, nothing received."""
    server = build(digits_tiny_root, tmp_path)
    c = server.clients[0]
    got = []
    receive = c.receive
    monkeypatch.setattr(c, "receive", lambda payload, participating=True: (got.append(participating),
                                                                          receive(payload, participating)))
    modes = []
    c.model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    c.model.eval()
    client_steps.join_late(c, server.global_model, 1)
    assert got == [True]
    tuned = modes[:-1]  # the last forward is the test evaluation, in eval mode
    assert tuned and all(tuned) and modes[-1] is False
    got.clear()
    client_steps.join_late(c, None, 0)
    assert got == []


def test_a_late_joiner_tests_the_model_its_algorithm_declares(digits_tiny_root, tmp_path):
    """Ditto declares ``new_client_model = "model"``: a client that joins after training is tested on the
    model it received, not on its personal model (which it never trained), here after two rounds in which
    the personal models moved away from it."""
    server = build(digits_tiny_root, tmp_path, "-algo", "Ditto")
    loop.run_round(server, 0)
    loop.run_round(server, 1)
    c = server.clients[2]
    personal = c.eval_model()
    assert personal is not c.model
    correct, n, _ = client_steps.join_late(c, server.global_model, 0)
    with torch.no_grad():
        by_hand = int((c.model(c.x_test).argmax(1) == c.y_test).sum())
        on_personal = int((personal(c.x_test).argmax(1) == c.y_test).sum())
    assert (correct, n) == (by_hand, c.test_samples) and on_personal != by_hand


def test_the_sampled_training_loss_is_the_clients_own_seeded_draw(digits_tiny_root, tmp_path):
    from utils.seeding import torch_gen

    c = build(digits_tiny_root, tmp_path, "--train_loss_eval", "sampled", "--train_loss_fraction", "0.25",
              "--seed", "2").clients[3]
    k = math.ceil(0.25 * c.train_samples)
    want = torch.randperm(c.train_samples, generator=torch_gen(2, 0, "train-loss", 3))[:k].sort().values
    assert torch.equal(client_steps.train_loss_sample(c), want)
