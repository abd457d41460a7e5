"""Inverting Gradients (Geiping et al. 2020, ``-dlga ig``): its cost terms by hand, a reconstruction that beats a
random guess only when the gradient matching works, and the attack inside a run."""
import math

import pytest
import torch
from torch import nn

import main
from cli import parse_config
from conftest import cli
from utils import dlg
from utils.results import read_h5
from utils.seeding import torch_gen


def test_cosine_loss_hand_values():
    # one angle over both tensors together: g = (1, 2 | 2), t = (2, 0 | 1): g.t = 2 + 0 + 2 = 4,
    # |g| = 3, |t| = sqrt(5): 1 - 4 / (3 sqrt 5)
    g = [torch.tensor([1.0, 2.0]), torch.tensor([[2.0]])]
    t = [torch.tensor([2.0, 0.0]), torch.tensor([[1.0]])]
    assert dlg.cosine_loss(g, t).item() == pytest.approx(1 - 4 / (3 * math.sqrt(5)), rel=1e-6)
    # per-tensor cosines would give another value: (1 - 1/sqrt5) + (1 - 1) for these two tensors
    assert dlg.cosine_loss(g, t).item() != pytest.approx(1 - 1 / math.sqrt(5), rel=1e-3)
    # scale-free: only the direction counts; opposite directions cost 2
    assert dlg.cosine_loss([5 * x for x in g], t).item() == pytest.approx(1 - 4 / (3 * math.sqrt(5)), rel=1e-6)
    assert dlg.cosine_loss([-x for x in t], t).item() == pytest.approx(2.0, rel=1e-6)


def test_total_variation_hand_values():
    # one 2 x 3 image [[0, 1, 3], [2, 2, 2]]: horizontal |1-0|, |3-1|, |2-2|, |2-2| -> mean 3/4;
    # vertical |2-0|, |2-1|, |2-3| -> mean 4/3
    x = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 2.0]])[None, None]
    assert dlg.total_variation(x).item() == pytest.approx(3 / 4 + 4 / 3, rel=1e-6)
    assert dlg.total_variation(torch.full((2, 3, 4, 4), 0.7)).item() == 0.0
    # 3 x 3 [[0, 1, 2], [3, 4, 5], [6, 7, 9]]: horizontal 1, 1, 1, 1, 1, 2 -> 7/6; vertical 3, 3, 3, 3, 3, 4 -> 19/6
    x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 9.0]])[None, None]
    assert dlg.total_variation(x).item() == pytest.approx(7 / 6 + 19 / 6, rel=1e-6)


def _box():
    return torch.tensor(-1.0), torch.tensor(1.0)  # the pixels 0 and 1 normalised by mean 0.5, std 0.5


def test_ig_recovers_a_digit_better_than_a_random_guess(digits_images, digits_mlp):
    pixels, normed, labels = digits_images
    i = 7
    target = dlg.model_gradient(digits_mlp, normed[i:i + 1], labels[i:i + 1])
    before = {k: v.clone() for k, v in digits_mlp.state_dict().items()}
    rec = dlg.invert_gradients(digits_mlp, target, (1, 8, 8), 1, 10, iters=200, generator=torch_gen(0, 0, "ig"),
                               bounds=_box())
    got = dlg.psnr(dlg.denormalize(rec.x, [0.5], [0.5]), pixels[i:i + 1]).item()
    init = torch.randn((1, 1, 8, 8), generator=torch_gen(0, 0, "ig"))  # where the attack starts
    start = dlg.psnr(dlg.denormalize(init, [0.5], [0.5]), pixels[i:i + 1]).item()
    random = dlg.psnr(torch.rand(1, 1, 8, 8, generator=torch_gen(0, 0, "r")), pixels[i:i + 1]).item()
    assert random < 12 and start < 12
    assert got > 25, got  # far above any guess: the gradient's direction pins the image down
    assert rec.labels.tolist() == [int(labels[i])]  # iDLG's label rule
    assert float(rec.x.min()) >= -1 - 1e-6 and float(rec.x.max()) <= 1 + 1e-6  # kept in the pixel box
    assert all(torch.equal(v, before[k]) for k, v in digits_mlp.state_dict().items())


def test_ig_on_a_linear_model_finds_the_image_direction():
    """A linear softmax model on non-negative inputs: dL/dW = (p - y) x^T, so matching the direction of the
    weight gradient recovers x (and iDLG's rule the label); the reconstruction beats a random guess by a
    wide margin (with the matching broken it does not: its error is that of a guess)."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("flat", nn.Flatten())
    model.add_module("fc", nn.Linear(16, 3))
    with torch.no_grad():
        model.fc.weight.copy_(torch.randn(3, 16, generator=torch_gen(1, 0, "w")) * 0.1)
    x = torch.rand(1, 1, 4, 4, generator=torch_gen(1, 0, "x"))
    y = torch.tensor([2])
    target = dlg.model_gradient(model, x, y)
    rec = dlg.invert_gradients(model, target, (1, 4, 4), 1, 3, iters=200, tv=0.0, generator=torch_gen(1, 0, "i"),
                               bounds=(torch.tensor(0.0), torch.tensor(1.0)))
    err = float((rec.x - x).pow(2).mean())
    guess = float((torch.rand(1, 1, 4, 4, generator=torch_gen(1, 0, "g")) - x).pow(2).mean())
    assert err < guess / 100, (err, guess)
    assert rec.loss < 1e-3 and rec.labels.tolist() == [2]


def test_ig_in_a_run_reports_the_same_series(digits_tiny_root, tmp_path, capsys):
    out = tmp_path / "ig"
    rc = main.main(cli(digits_tiny_root, out, "--executor", "sequential", "-algo", "FedAvg", "-nc", "3", "-gr", "1",
                       "-lbs", "20", "--train_loss_eval", "off", "-dlg", "-dlgg", "1", "--dlg_clients", "1", "-bnpc",
                       "1", "-dlga", "ig", "--ig_iters", "200", "-m", "DNN"))
    assert rc == 0
    assert "IG on gradient" in capsys.readouterr().out
    h = read_h5(next(out.glob("*.h5")))
    assert list(h["rs_dlg_round"]) == [0]
    assert h["rs_dlg_psnr"][0] > h["rs_dlg_psnr_guess"][0] + 10  # one image of an untrained model: recovered
    assert (out / next(out.glob("*_dlg_r0.png")).name).exists()


# ---- the dummies and the released gradient, by hand ------------------------------------------------------
def _small_model():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("hidden", nn.Linear(4, 5))
    model.add_module("act", nn.ReLU())
    model.add_module("fc", nn.Linear(5, 3))
    return model


@pytest.mark.parametrize("soft", [False, True])
def test_the_dp_aware_dummy_gradient_is_the_mean_of_per_sample_gradients_clipped_by_hand(soft):
    """Three samples, clip between the smallest per-sample norm and 2x it (that sample is kept as is, not
    scaled up) and below the largest (that one is scaled down): the mean of the clipped per-sample
    gradients, each from its own backward pass. Soft labels: the cross-entropy against softmax(labels)."""
    import copy

    import torch.nn.functional as F

    model = _small_model()
    x = torch.randn(3, 4, generator=torch_gen(0, 0, "x"))
    y = torch.randn(3, 3, generator=torch_gen(0, 0, "y")) if soft else torch.tensor([0, 2, 1])
    names = ["hidden.weight", "fc.weight", "fc.bias"]  # not hidden.bias: only the named entries are released
    per = []
    for i in range(3):
        m = copy.deepcopy(model)
        out = m(x[i:i + 1])
        loss = (-(torch.softmax(y[i:i + 1], 1) * F.log_softmax(out, 1)).sum() if soft
                else F.cross_entropy(out, y[i:i + 1]))
        loss.backward()
        per.append([dict(m.named_parameters())[n].grad for n in names])
    norms = [float(torch.sqrt(sum((g ** 2).sum() for g in gs))) for gs in per]
    clip = 1.5 * min(norms)
    assert max(norms) > clip  # one sample clipped, one left alone
    want = [sum(gs[j] * min(1.0, clip / (nrm + 1e-6)) for gs, nrm in zip(per, norms)) / 3 for j in range(3)]
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    got = dlg._released_gradient(model, params, names, x, y, clip)
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))
    unclipped = dlg._released_gradient(model, params, names, x, y)  # without clip: the batch's mean gradient
    assert all(torch.allclose(g, sum(gs[j] for gs in per) / 3, atol=1e-6) for j, g in enumerate(unclipped))


@pytest.mark.parametrize("attack", ["ig", "dlg", "idlg"])
def test_an_attack_leaves_the_attacked_model_untouched(attack):
    """Whether it targets every parameter or the classifier only, an attack reads the model and never
    writes it: no value changes and no parameter gets a gradient."""
    model = _small_model()
    x, y = torch.rand(1, 4, generator=torch_gen(0, 0, "x")), torch.tensor([2])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for names in (None, ["fc.weight", "fc.bias"]):
        target = dlg.model_gradient(model, x, y, names)
        if attack == "ig":
            dlg.invert_gradients(model, target, (4,), 1, 3, iters=3, tv=0, generator=torch_gen(0, 0, "d"))
        else:
            dlg.reconstruct(model, target, (4,), 1, 3, method=attack, iters=3, generator=torch_gen(0, 0, "d"))
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_ig_takes_given_labels_or_infers_them_before_any_step():
    """One iteration returns the starting dummy (its cost is measured before the step), so the labels are
    the ones IG starts from: iDLG's inferred label (the true one here), or the labels given. The dummies come
    from the generator, or from the global stream without one."""
    model = _small_model()
    x, y = torch.rand(1, 4, generator=torch_gen(0, 0, "x")), torch.tensor([2])
    target = dlg.model_gradient(model, x, y)
    assert dlg.infer_labels(target, "fc.weight", 1).tolist() == [2]
    gen = torch_gen(0, 0, "d")
    start = torch.randn((1, 4), generator=torch_gen(0, 0, "d"))
    rec = dlg.invert_gradients(model, target, (4,), 1, 3, iters=1, tv=0, generator=gen)
    assert rec.labels.tolist() == [2] and rec.labels.dtype == torch.long and torch.equal(rec.x, start)
    given = dlg.invert_gradients(model, target, (4,), 1, 3, labels=torch.tensor([0]), iters=1, tv=0,
                                 generator=torch_gen(0, 0, "d"))
    assert given.labels.tolist() == [0]  # not re-inferred
    torch.manual_seed(5)
    unseeded = dlg.invert_gradients(model, target, (4,), 1, 3, iters=1, tv=0)
    torch.manual_seed(5)
    assert torch.equal(unseeded.x, torch.randn(1, 4)) and unseeded.labels.tolist() == [2]


def test_ig_steps_follow_the_reference_schedule():
    """72 iterations: Adam's rate 0.1 drops tenfold at 3/8, 5/8 and 7/8 of them (iterations 27, 45, 63)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen = []
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    try:
        model = _small_model()
        target = dlg.model_gradient(model, torch.rand(1, 4, generator=torch_gen(0, 0, "x")), torch.tensor([2]))
        dlg.invert_gradients(model, target, (4,), 1, 3, iters=72, tv=0, generator=torch_gen(0, 0, "d"))
    finally:
        handle.remove()
    assert seen == pytest.approx([0.1] * 27 + [0.01] * 18 + [0.001] * 18 + [1e-4] * 9, rel=1e-9)


def test_ig_refuses_its_image_prior_on_other_inputs():
    model = _small_model()
    target = dlg.model_gradient(model, torch.rand(1, 4, generator=torch_gen(0, 0, "x")), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"needs image inputs \(C x H x W\), got inputs of shape \(4,\); pass tv=0"):
        dlg.invert_gradients(model, target, (4,), 1, 3, iters=1)


def test_ig_defaults_are_the_papers_and_the_clis_and_its_options_are_keywords():
    import inspect

    cfg = parse_config([])
    p = inspect.signature(dlg.invert_gradients).parameters
    assert (p["iters"].default, p["tv"].default, p["lr"].default) == (cfg.ig_iters, cfg.ig_tv, 0.1) == (4000, 1e-4, 0.1)
    assert all(p[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("labels", "iters", "tv", "lr", "generator",
                                                                      "bounds", "clip"))


@pytest.mark.parametrize("bounds", [None, (-0.5, 0.5)])
@pytest.mark.parametrize("aim", ["truth", "start"])
def test_ig_by_hand_sign_adam_in_the_box_keeping_the_cheapest_dummy(aim, bounds):
    """Three iterations of IG on a linear model of 4 x 4 images, replayed by hand: the cost of each dummy
    (1 - cos of its gradient with the target over every parameter, plus tv times its total variation; its
    gradient by plain autograd), Adam (0.9, 0.999, 1e-8, bias-corrected) on the sign of that gradient at the
    scheduled rates (milestones int(3 * 3/8) = 1 twice and int(3 * 7/8) = 2: lr, lr / 100), each step
    projected into the box. Returned: the dummy of the lowest cost, that cost, the cost of iteration 0 as the
    history, three iterations. Aimed at another image the costs fall, so the last dummy is returned (the
    steps by hand); aimed at the starting dummy's own gradient the start is the cheapest and is kept."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    start = torch.randn((1, 1, 4, 4), generator=torch_gen(0, 0, "d"))
    aimed = torch.rand(1, 1, 4, 4, generator=torch_gen(0, 0, "truth")) if aim == "truth" else start
    label = torch.tensor([2])
    target = dlg.model_gradient(model, aimed, label)
    names = list(target)
    tv, lr = 0.01, 1.0
    box = None if bounds is None else (torch.tensor(bounds[0]), torch.tensor(bounds[1]))
    rec = dlg.invert_gradients(model, target, (1, 4, 4), 1, 3, labels=label, iters=3, tv=tv, lr=lr,
                               generator=torch_gen(0, 0, "d"), bounds=box)

    def cost(x):
        x = x.clone().requires_grad_(True)
        params = dict(model.named_parameters())
        g = torch.autograd.grad(F.cross_entropy(model(x), label), [params[n] for n in names], create_graph=True)
        t = [target[n] for n in names]
        dot = sum((a * b).sum() for a, b in zip(g, t))
        c = 1 - dot / (torch.sqrt(sum((a * a).sum() for a in g)) * torch.sqrt(sum((b * b).sum() for b in t)))
        c = c + tv * ((x[..., :, 1:] - x[..., :, :-1]).abs().mean() + (x[..., 1:, :] - x[..., :-1, :]).abs().mean())
        return float(c.detach()), torch.autograd.grad(c, x)[0]

    x = start.clone()
    m = v = torch.zeros_like(x)
    dummies, costs = [], []
    for t, rate in enumerate([lr, lr / 100, lr / 1000], start=1):
        c, grad = cost(x)
        dummies.append(x.clone())
        costs.append(c)
        s = torch.sign(grad)
        m, v = 0.9 * m + 0.1 * s, 0.999 * v + 0.001 * s * s
        x = x - rate * (m / (1 - 0.9 ** t)) / (torch.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        if bounds is not None:
            x = x.clamp(*bounds)
    best = min(range(3), key=lambda i: costs[i])
    assert best == (2 if aim == "truth" else 0) and len(set(costs)) == 3  # what each case exercises; no tie
    assert rec.loss == pytest.approx(costs[best], abs=1e-6) and torch.allclose(rec.x, dummies[best], atol=1e-5)
    assert rec.history == pytest.approx(costs[:1], abs=1e-6) and rec.iterations == 3
    assert not rec.x.requires_grad


def test_ig_stops_at_a_non_finite_cost_and_returns_its_start():
    """A target holding NaN makes the first cost NaN: no step is taken, the starting dummy comes back (as a
    plain tensor) with an infinite loss and no iteration counted."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    target = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    rec = dlg.invert_gradients(model, target, (1, 4, 4), 1, 3, labels=torch.tensor([1]), iters=5,
                               generator=torch_gen(0, 0, "d"))
    assert rec.loss == float("inf") and rec.iterations == 0 and rec.history == []
    assert torch.equal(rec.x, torch.randn((1, 1, 4, 4), generator=torch_gen(0, 0, "d"))) and not rec.x.requires_grad


@pytest.mark.parametrize("iters,kept", [(100, 1), (101, 2)])
def test_ig_keeps_the_cost_of_every_hundredth_iteration(iters, kept):
    model = _small_model()
    target = dlg.model_gradient(model, torch.rand(1, 4, generator=torch_gen(0, 0, "x")), torch.tensor([2]))
    rec = dlg.invert_gradients(model, target, (4,), 1, 3, iters=iters, tv=0, generator=torch_gen(0, 0, "d"))
    assert len(rec.history) == kept and rec.iterations == iters


def test_ig_without_the_classifiers_gradient_learns_soft_labels_and_returns_their_argmax():
    """The target holds the hidden layer only: no label can be inferred, so two soft labels are optimised
    with the inputs; one iteration returns the start, whose labels are the argmax over the classes of the
    soft labels drawn after the inputs."""
    model = _small_model()
    x, y = torch.rand(2, 4, generator=torch_gen(0, 0, "x")), torch.tensor([2, 0])
    target = dlg.model_gradient(model, x, y, ["hidden.weight", "hidden.bias"])
    gen = torch_gen(0, 0, "d")
    torch.randn((2, 4), generator=gen)
    soft = torch.randn((2, 3), generator=gen)
    rec = dlg.invert_gradients(model, target, (4,), 2, 3, iters=1, tv=0, generator=torch_gen(0, 0, "d"))
    assert rec.labels.tolist() == soft.argmax(dim=1).tolist() and soft.argmax(dim=1).tolist() != [0, 0]
