"""Privacy: gradient inversion (DLG / iDLG) and its metrics, DP-SGD and its accountant, and both inside a run."""
import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import main
from cli import parse_config
from conftest import cli
from flcore.trainmodel.models import DNN
from utils import dlg, dp_sgd, privacy_monitor
from utils.entries import trainable_names
from utils.errors import FLError
from utils.results import read_h5
from utils.seeding import torch_gen, torch_seeded
from runtime import loop


# ---- metrics on known images -----------------------------------------------------------------------
def test_psnr_hand_values():
    a = torch.zeros(1, 1, 8, 8)
    assert dlg.psnr(a, a + 0.1).item() == pytest.approx(20.0, abs=1e-4)  # MSE 0.01
    # three channels, one off by 0.3: MSE = 0.09 / 3 (the mean over channels, not a division by 3 of a sum)
    b = torch.zeros(1, 3, 4, 4)
    c = b.clone()
    c[:, 1] = 0.3
    assert dlg.psnr(b, c).item() == pytest.approx(10 * math.log10(1 / 0.03), abs=1e-4)
    assert dlg.psnr(a, a).item() == dlg.MAX_PSNR == 100.0  # MSE floored at 1e-10: 10 log10(1e10) dB
    assert dlg.psnr(torch.zeros(2, 1, 2, 2), torch.full((2, 1, 2, 2), 255.0), data_range=255.0).tolist() == [0.0, 0.0]


def test_ssim_hand_values(digits_images):
    pixels = digits_images[0][:3]
    assert torch.allclose(dlg.ssim(pixels, pixels), torch.ones(3), atol=1e-6)
    # constant images: variances and covariance vanish, so SSIM = (2ab + C1) / (a^2 + b^2 + C1)
    a, b, c1 = 0.2, 0.6, 0.01 ** 2
    got = dlg.ssim(torch.full((1, 1, 16, 16), a), torch.full((1, 1, 16, 16), b)).item()
    assert got == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-6)
    # a zero-mean pattern against its negative: luminance term 1, structure term (C2 - 2v) / (2v + C2)
    # computed over each window; on a checkerboard every window has the same v, so the mean is that value
    board = ((torch.arange(11)[:, None] + torch.arange(11)[None]) % 2).float()[None, None] * 0.5 + 0.25
    neg = 1.0 - board
    win = dlg._gaussian_window(11, 1.5, torch.float64, "cpu")
    mu = float((win * board[0, 0].double()).sum())
    v = float((win * (board[0, 0].double() - mu) ** 2).sum())
    c2 = 0.03 ** 2
    lum = (2 * mu * (1 - mu) + c1) / (mu ** 2 + (1 - mu) ** 2 + c1)
    assert dlg.ssim(board, neg).item() == pytest.approx(lum * (c2 - 2 * v) / (2 * v + c2), rel=1e-5)


def test_match_recovers_a_permutation(digits_images):
    pixels = digits_images[0][:5]
    perm = torch.tensor([3, 0, 4, 1, 2])
    order, scores = dlg.match(pixels, pixels[perm])
    assert order.tolist() == perm.tolist() and torch.all(scores == dlg.MAX_PSNR)
    order, _ = dlg.match(digits_images[0][:50], pixels[[4, 2]])  # more originals than reconstructions
    assert order.tolist() == [4, 2]


def test_guess_scores_are_those_of_a_grey_image():
    originals = torch.cat([torch.full((1, 1, 8, 8), 0.1), torch.full((1, 1, 8, 8), 0.8)])
    psnr, ssim = privacy_monitor.guess_scores(originals, 1, [0.5], [0.5])  # one guess: its best match is 0.8
    assert psnr.tolist() == pytest.approx([10 * math.log10(1 / 0.09)], abs=1e-4)
    c1 = 0.01 ** 2
    assert ssim.tolist() == pytest.approx([(2 * 0.5 * 0.8 + c1) / (0.25 + 0.64 + c1)], rel=1e-5)
    # three channels, each with its own mean and std: the guess is mid-grey per channel (the means)
    a, b = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.8, 0.6, 0.4])
    originals = torch.stack([a, b]).view(2, 3, 1, 1).expand(2, 3, 8, 8)
    mean = [0.7, 0.5, 0.45]
    psnr, ssim = privacy_monitor.guess_scores(originals, 1, mean, [0.2, 0.3, 0.1])
    mse = ((0.8 - 0.7) ** 2 + (0.6 - 0.5) ** 2 + (0.4 - 0.45) ** 2) / 3  # b is nearer (0.0075 against 0.1575)
    assert psnr.tolist() == pytest.approx([10 * math.log10(1 / mse)], abs=1e-4)
    per_channel = [(2 * x * m + c1) / (x * x + m * m + c1) for x, m in zip(b.tolist(), mean)]  # flat: no c2 term
    assert ssim.tolist() == pytest.approx([sum(per_channel) / 3], rel=1e-5)


def stub_split(shape, num_classes=10, config=None):
    """What the privacy monitor reads of a split: its input shape, classes, config (normalisation) and name."""
    return SimpleNamespace(input_shape=shape, num_classes=num_classes, config=config or {}, name="Stub")


def test_the_monitors_defaults_are_pfllibs_and_the_dlg_papers():
    """-dlgg 100 and -bnpc 2 as PFLlib's flags; 300 L-BFGS iterations on one image as the DLG paper; two
    clients attacked per attacked round (this library's, PFLlib attacks every upload)."""
    cfg = parse_config(["-dlg"])
    assert (cfg.dlg_gap, cfg.batch_num_per_client, cfg.dlg_iters, cfg.dlg_batch, cfg.dlg_clients) == (100, 2, 300, 1, 2)


def test_each_round_attacks_k_distinct_clients_drawn_among_all_active():
    cfg = parse_config(["-dlg", "--dlg_clients", "2", "-dlgg", "2"])
    monitor = privacy_monitor.PrivacyMonitor(cfg, 0, stub_split([1, 8, 8]))
    active = [SimpleNamespace(id=cid, model=nn.Linear(2, 2)) for cid in (3, 8, 11, 14, 20)]
    attacked = []
    for r in range(40):
        monitor.before_training(r, active)
        if r % 2:  # -dlgg 2: only even rounds attack
            assert monitor.starts == {}
            continue
        attacked.append(set(monitor.starts))
        for c in active:  # the model each starts from, as a copy (training changes the client's own)
            if c.id in monitor.starts:
                assert monitor.starts[c.id] is not c.model and torch.equal(monitor.starts[c.id].weight, c.model.weight)
    assert all(len(ids) == 2 for ids in attacked) and set().union(*attacked) == {3, 8, 11, 14, 20}
    monitor.before_training(0, active[:1])  # fewer active clients than -dlgc: each of them
    assert set(monitor.starts) == {3}


@pytest.mark.parametrize("attack", ["dlg", "ig"])
@pytest.mark.parametrize("target,dp", [("gradient", False), ("gradient", True), ("update", True)])
def test_the_monitor_attacks_what_the_client_reveals_and_scores_it_by_hand(attack, target, dp, monkeypatch, capsys,
                                                                           tmp_path):
    """The attack (replaced here by a stand-in that reports what it was given and returns one black and one
    white image) gets the gradient of a drawn batch of two images (DP-SGD's clipped release under -dp, with
    a DP-aware attacker), or the upload's pseudo-gradient; the printed scores are worked out by hand."""
    import itertools
    import re
    from collections import Counter
    pixels = [0.1, 0.2, 0.3, 0.6, 0.7, 0.9]  # one grey level per image; the split normalises with 0.4 / 0.5
    labels = torch.tensor([1, 0, 1, 0, 2, 0])
    x_train = ((torch.tensor(pixels) - 0.4) / 0.5).view(6, 1, 1, 1).expand(6, 1, 4, 4).contiguous()
    data = stub_split([1, 4, 4], 3, {"normalize": {"mean": [0.4], "std": [0.5]}})
    with torch_seeded(0, 0, "test-monitor"):
        start = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    names = ["1.weight", "1.bias"]
    cfg = parse_config(["-dlg", "-dlgg", "1", "--dlg_clients", "1", "--dlg_batch", "2", "-bnpc", "2",
                             "-dlga", attack, "--dlg_target", target, "-dev", "cpu"])
    cfg = cfg.replace(privacy=dp, dp_level="sample", dp_clip=0.05, dp_sigma=0.0)  # no noise: the release is exact
    saved, grids = [], []
    recorder = SimpleNamespace(out_dir=tmp_path / "results" / "run", stem="Stub_FedAvg",
                               add_series=lambda name, r, values: saved.append((name, r, values)),
                               save=lambda: (saved.append("saved"),  # as RunRecorder.save, it makes its folder
                                             (tmp_path / "results" / "run").mkdir(parents=True, exist_ok=True)))
    monitor = privacy_monitor.PrivacyMonitor(cfg, 0, data, recorder)
    monkeypatch.setattr(dlg, "save_grid", lambda orig, recon, path, titles: grids.append(
        (orig.flatten(1)[:, 0].tolist(), recon.flatten(1)[:, 0].tolist(), path, path.parent.is_dir(), titles)))
    client = SimpleNamespace(id=7, model=start, x_train=x_train, y_train=labels, train_samples=6,
                             learning_rate=lambda r: 0.1, steps_per_round=lambda: 4)

    def per_sample(i):  # the cross-entropy gradient of one image, clipped to the norm 0.05 under -dp
        loss = F.cross_entropy(start(x_train[i:i + 1]), labels[i:i + 1])
        g = torch.autograd.grad(loss, list(start.parameters()))
        norm = float(torch.sqrt(sum((t ** 2).sum() for t in g)))
        scale = min(1.0, 0.05 / norm) if dp else 1.0
        return [t * scale for t in g]

    grads = [per_sample(i) for i in range(6)]
    shift = {n: torch.randn(p.shape, generator=torch_gen(0, 0, "test-shift", n)) for n, p in start.named_parameters()}
    calls = []

    def stand_in(model, got, input_shape, batch, num_classes, **kw):
        calls.append((got, kw))
        assert model is not start and input_shape == (1, 4, 4) and (batch, num_classes) == (2, 3)
        white = (1 - 0.4) / 0.5
        return dlg.Reconstruction(x=torch.tensor([-0.8, white]).view(2, 1, 1, 1).expand(2, 1, 4, 4),
                                  labels=torch.tensor([0, 1]), loss=0.5, iterations=1, history=[])

    monkeypatch.setattr(dlg, "invert_gradients" if attack == "ig" else "reconstruct", stand_in)
    capsys.readouterr()
    drawn = []
    for r in range(4):
        monitor.before_training(r, [client])
        # the client trains: its upload is the start moved by lr x steps x shift
        upload = SimpleNamespace(id=7, state={n: p.detach() - 0.1 * 4 * shift[n] for n, p in start.named_parameters()})
        monitor.after_upload(r, [client], [upload])
        assert len(calls) == 2 * (r + 1)
        images, guess, hits, tops = [], [], 0, []
        for got, kw in calls[-2:]:
            assert kw["clip"] == (0.05 if dp and target == "gradient" else None)  # a DP-aware attacker
            if attack == "ig":
                low, high = kw["bounds"]
                assert (low.item(), high.item(), kw["iters"], kw["tv"]) == (pytest.approx(-0.8), pytest.approx(1.2),
                                                                            cfg.ig_iters, cfg.ig_tv)
            else:
                assert (kw["method"], kw["iters"]) == (attack, cfg.dlg_iters)
            if target == "update":  # (start - upload) / (lr x steps): the shift; every image is a candidate
                assert all(torch.allclose(got[n], shift[n], atol=1e-5) for n in names)
                batch = list(range(6))
            else:  # the one pair of images whose mean (clipped) gradient this is
                pairs = [(i, j) for i, j in itertools.combinations(range(6), 2)
                         if all(torch.allclose(got[n], (grads[i][k] + grads[j][k]) / 2, atol=1e-6)
                                for k, n in enumerate(names))]
                assert len(pairs) == 1, pairs
                batch = list(pairs[0])
                drawn.append(pairs[0])
            # best pairing: black with the darkest candidate, white with the brightest
            dark, bright = min(batch, key=lambda i: pixels[i]), max(batch, key=lambda i: pixels[i])
            images += [10 * math.log10(1 / pixels[dark] ** 2), 10 * math.log10(1 / (1 - pixels[bright]) ** 2)]
            tops += [pixels[dark], pixels[bright]]
            if target == "gradient":  # labels as a multiset (the batch order is unknown)
                hits += sum((Counter([0, 1]) & Counter(labels[batch].tolist())).values())
            else:  # labels of the images matched
                hits += int(labels[dark] == 0) + int(labels[bright] == 1)
            # the know-nothing guess: two images at the split's mean (0.4), matched to the nearest candidates
            guess += [10 * math.log10(1 / d ** 2) for d in sorted(abs(pixels[i] - 0.4) for i in batch)[:2]]
        line = capsys.readouterr().out.strip().splitlines()[-1]
        found = re.search(r"PSNR ([\d.]+) dB \(max ([\d.]+); grey guess ([\d.]+)\).*labels ([\d.]+) \| (\d+) image",
                          line)
        assert found, line
        assert float(found[1]) == pytest.approx(sum(images) / 4, abs=0.006)
        assert float(found[2]) == pytest.approx(max(images), abs=0.006)
        assert float(found[3]) == pytest.approx(sum(guess) / 4, abs=0.006)
        assert (float(found[4]), int(found[5])) == (pytest.approx(hits / 4, abs=0.006), 4)
        # recorded, saved, and drawn: the originals matched on top, the reconstructions below, titled by PSNR
        name, rnd, values = saved[-2]
        assert (name, rnd, saved[-1]) == ("dlg", r, "saved") and values["images"] == 4
        assert values["psnr"] == pytest.approx(sum(images) / 4, abs=1e-4)
        assert values["label_acc"] == pytest.approx(hits / 4) and values["psnr_guess"] == pytest.approx(sum(guess) / 4)
        top, bottom, path, made, titles = grids[-1]
        assert top == pytest.approx(tops, abs=1e-6) and bottom == pytest.approx([0.0, 1.0, 0.0, 1.0], abs=1e-6)
        assert path == tmp_path / "results" / "run" / f"Stub_FedAvg_dlg_r{r}.png" and made
        assert titles == [f"{p:.1f} dB" for p in images]
    if target == "gradient":
        assert len(set(drawn)) >= 3  # a batch of its own each time, drawn among all six images


def test_dp_figures_are_each_clients_epsilon_and_a_trained_client_without_one_is_an_error():
    from plugins.dp_sample import SampleDP

    cfg = parse_config([]).replace(privacy=True, dp_level="sample", dp_delta=1e-5)
    eps = {1: 0.5, 2: 0.0, 3: 2.5, 5: 0.0}
    # a client's accountant, answering at --dp_delta only; the server calls dp_epsilon where each client lives
    clients = [SimpleNamespace(id=cid, dp=SimpleNamespace(epsilon=lambda delta, cid=cid: eps[cid] if delta == 1e-5
                                                          else -1.0)) for cid in eps]
    server = SimpleNamespace(cfg=cfg, clients=clients,
                             call_clients=lambda cs, fn, *args: [fn(c, *args) for c in cs])
    dp = SampleDP()
    dp.before_training(server, [clients[0], clients[2]])  # 2 and 5 have not trained: an epsilon of 0 is right
    got = dp.metrics(server, None, None)
    assert (got["dp_epsilon_max"], got["dp_epsilon_mean"]) == (2.5, 0.75)
    assert got["dp_client_epsilon"].tolist() == [0.5, 0.0, 2.5, 0.0]
    dp.before_training(server, clients)  # now all four trained: 2 and 5 without a DP step
    with pytest.raises(FLError, match=r"^-dp: client 2 trained but its DP accountant is empty"):
        dp.metrics(server, None, None)
    assert SampleDP.build(cfg.replace(privacy=False), server) is None


def test_the_monitor_reads_pixel_bounds_per_channel_from_the_split():
    cfg = parse_config(["-dlg"])

    def box(shape, config):
        return privacy_monitor.PrivacyMonitor(cfg, 0, stub_split(shape, config=config)).box()

    low, high = box([3, 4, 5], {})  # no normalisation: the inputs are pixels, in [0, 1] per channel
    assert low.shape == high.shape == (3, 1, 1) and low.flatten().tolist() == [0.0] * 3
    assert high.flatten().tolist() == [1.0] * 3
    low, high = box([3, 4, 5], {"normalize": {"mean": [0.5, 0.4, 0.3], "std": [0.5, 0.2, 0.1]}})
    assert low.flatten().tolist() == pytest.approx([-1.0, -2.0, -3.0])  # (0 - mean) / std
    assert high.flatten().tolist() == pytest.approx([1.0, 3.0, 7.0])  # (1 - mean) / std
    with pytest.raises(FLError, match="-dlg reconstructs images"):
        box([64], {})


def test_denormalize_inverts_the_split_normalisation(digits_images):
    pixels, normed, _ = digits_images
    assert torch.allclose(dlg.denormalize(normed[:4], [0.5], [0.5]), pixels[:4], atol=1e-6)


# ---- the attacks -----------------------------------------------------------------------------------
def test_idlg_label_rule_is_exact(digits_images, digits_mlp):
    _, normed, labels = digits_images
    name = dlg.classifier_name(digits_mlp, 10)
    assert name == "fc.weight"
    for i in range(20):
        g = dlg.model_gradient(digits_mlp, normed[i:i + 1], labels[i:i + 1])
        assert dlg.infer_labels(g, name, 1).tolist() == [int(labels[i])]


def test_batch_label_rule_is_gradinversions_row_minimum():
    """batch > 1: the classes whose gradient rows have the most negative minimum entry (Yin et al. 2021),
    not the most negative sums; a hand-made gradient where the two rules disagree."""
    g = {"fc.weight": torch.tensor([[-0.1, -0.1, -0.1, -0.1],   # sum -0.4, min -0.1
                                    [0.5, 0.5, 0.5, -0.9],      # sum  0.6, min -0.9
                                    [-0.3, 0.0, 0.0, 0.0],      # sum -0.3, min -0.3
                                    [0.2, 0.2, 0.2, 0.2]])}     # sum  0.8, min  0.2
    assert dlg.infer_labels(g, "fc.weight", 2).tolist() == [1, 2]  # mins -0.9, -0.3 (sums would give 0, 2)
    assert dlg.infer_labels(g, "fc.weight", 1).tolist() == [0]  # one image: iDLG's most negative row sum
    assert dlg.infer_labels(g, "head.weight", 1) is None and dlg.infer_labels(g, None, 1) is None  # not uploaded


def test_the_attacked_models_frozen_parameters_stay_frozen(digits_images, digits_mlp):
    """model_gradient takes gradients on detached copies: asked for a frozen parameter's gradient, it does
    not unfreeze the model's own."""
    _, normed, labels = digits_images
    model = copy.deepcopy(digits_mlp)
    name, frozen = next(iter(model.named_parameters()))
    frozen.requires_grad_(False)
    g = dlg.model_gradient(model, normed[:2], labels[:2], names=[name])
    assert list(g) == [name] and g[name].abs().sum() > 0 and not frozen.requires_grad and frozen.grad is None


def test_pseudo_gradient_of_no_step_is_the_update_over_the_rate():
    start, up = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([0.5, 3.0])}
    assert dlg.pseudo_gradient(start, up, lr=0.5, steps=0, names=["w", "b"])["w"].tolist() == [1.0, -2.0]


def test_batch_label_rule_recovers_distinct_labels(digits_images, digits_mlp):
    _, normed, labels = digits_images
    idx = [i for i in range(60) if int(labels[i]) in (1, 4, 7)]
    chosen = [next(i for i in idx if int(labels[i]) == c) for c in (1, 4, 7)]
    g = dlg.model_gradient(digits_mlp, normed[chosen], labels[chosen])
    assert dlg.infer_labels(g, "fc.weight", 3).tolist() == [1, 4, 7]


@pytest.mark.parametrize("method", ["dlg", "idlg"])
def test_attack_reconstructs_a_digit_from_its_gradient(digits_images, digits_mlp, method):
    pixels, normed, labels = digits_images
    target = dlg.model_gradient(digits_mlp, normed[7:8], labels[7:8])
    before = {k: v.clone() for k, v in digits_mlp.state_dict().items()}
    rec = dlg.reconstruct(digits_mlp, target, (1, 8, 8), 1, 10, method=method, iters=100, generator=torch_gen(0, 0, "t"))
    got = dlg.psnr(dlg.denormalize(rec.x, [0.5], [0.5]), pixels[7:8]).item()
    random = dlg.psnr(torch.rand(1, 1, 8, 8, generator=torch_gen(0, 0, "r")), pixels[7:8]).item()
    assert random < 12
    assert got > 40, got  # pixel-exact up to ~1 % error: only a real reconstruction gets here
    assert rec.labels.tolist() == [int(labels[7])]
    assert dlg.ssim(dlg.denormalize(rec.x, [0.5], [0.5]), pixels[7:8]).item() > 0.95
    assert all(torch.equal(v, before[k]) for k, v in digits_mlp.state_dict().items())  # the model is left as it was


def test_dp_noise_defeats_the_attack_clipping_alone_does_not(digits_images, digits_mlp):
    """A DP-aware attacker (it clips its dummy gradient like DP-SGD does) still reconstructs from a clipped
    gradient; the Gaussian noise is what stops it."""
    pixels, normed, labels = digits_images
    x, y = normed[7:8], labels[7:8]
    scores = []
    for sigma in (0.0, 1.0):
        target = dp_sgd.dp_gradient(digits_mlp, x, y, clip=1.0, sigma=sigma, generator=torch_gen(0, 0, "dp"))
        rec = dlg.reconstruct(digits_mlp, target, (1, 8, 8), 1, 10, method="idlg", iters=100,
                              generator=torch_gen(0, 0, "t"), clip=1.0)
        scores.append(dlg.psnr(dlg.denormalize(rec.x, [0.5], [0.5]), pixels[7:8]).item())
    assert scores[0] > 40 and scores[1] < 15, scores


def test_pseudo_gradient_of_one_sgd_step_is_the_gradient(digits_images, digits_mlp):
    _, normed, labels = digits_images
    g = dlg.model_gradient(digits_mlp, normed[:4], labels[:4])
    start = {k: v.clone() for k, v in digits_mlp.state_dict().items()}
    after = {k: start[k] - 0.1 * g[k] if k in g else start[k] for k in start}
    back = dlg.pseudo_gradient(start, after, lr=0.1, steps=1, names=list(g))
    assert all(torch.allclose(back[n], g[n], atol=1e-5) for n in g)


def test_align_state_maps_a_partial_upload():
    from flcore.trainmodel.parts import split_head

    model = split_head(DNN(64, 10))
    aligned = privacy_monitor.align_state(model, model.base.state_dict())
    assert set(aligned) == {f"base.{k}" for k in model.base.state_dict()}
    assert privacy_monitor.align_state(model, {"nope": torch.zeros(1)}) == {}


# ---- DP-SGD and the accountant -------------------------------------------------------------------------
def test_privatize_clips_each_sample_then_adds_calibrated_noise():
    g = {"w": torch.tensor([[3.0, 0.0, 0.0, 0.0], [0.3, 0.4, 0.0, 0.0]])}  # per-sample norms 3 and 0.5
    out = dp_sgd.privatize(g, clip=1.0, sigma=0.0, generator=torch_gen(0, 0, "n"))
    assert torch.allclose(out["w"], torch.tensor([(1.0 + 0.3) / 2, 0.4 / 2, 0.0, 0.0]), atol=1e-6)
    big = {"w": torch.zeros(2, 20000)}
    noise = dp_sgd.privatize(big, clip=0.5, sigma=2.0, generator=torch_gen(0, 0, "n"))["w"]
    assert noise.std().item() == pytest.approx(2.0 * 0.5 / 2, rel=0.03)  # sigma * C / B
    # the noise is the generator's own standard normal draws, scaled by sigma * C and added to the clipped sum
    out = dp_sgd.privatize(g, clip=1.0, sigma=0.7, generator=torch.Generator().manual_seed(5))["w"]
    z = torch.randn(4, generator=torch.Generator().manual_seed(5))
    assert torch.allclose(out, (torch.tensor([1.3, 0.4, 0.0, 0.0]) + 0.7 * 1.0 * z) / 2, atol=1e-6)


def test_per_sample_gradients_match_a_loop(digits_images, digits_mlp):
    _, normed, labels = digits_images
    x, y = normed[:5], labels[:5]
    holder = dp_sgd._LossHolder({"m": digits_mlp}, lambda a, b: torch.nn.functional.cross_entropy(digits_mlp(a), b))
    names = [f"m.{n}" for n in trainable_names(digits_mlp)]
    grads, losses = dp_sgd.per_sample_gradients(holder, names, x, y)
    for i in range(5):
        ref = dlg.model_gradient(digits_mlp, x[i:i + 1], y[i:i + 1])
        assert all(torch.allclose(grads[f"m.{n}"][i], ref[n], atol=1e-6) for n in ref)


# Published epsilons at delta = 1e-5 (the Poisson-subsampled Gaussian, classic RDP-to-DP conversion):
# Abadi et al., CCS 2016, Sec. 3.1: q = 0.01, sigma = 4, T = 10,000 steps -> eps ~ 1.26 (moments accountant);
# TensorFlow Privacy tutorials/README.md (MNIST, 60,000 samples, batch 256): sigma 1.12, 60 epochs -> 2.92;
# sigma 1.2, 10 epochs -> 1.20.
PUBLISHED = [(4.0, 0.01, 10000, 1.26), (1.12, 256 / 60000, 60 * 60000 // 256, 2.92),
             (1.2, 256 / 60000, 10 * 60000 // 256, 1.20)]


@pytest.mark.optional_deps("opacus")
@pytest.mark.parametrize("sigma,q,steps,eps", PUBLISHED)
def test_accountant_matches_published_epsilons(sigma, q, steps, eps):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = np.array(RDPAccountant.DEFAULT_ALPHAS)
    rdp = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    classic = np.min(rdp + np.log(1 / 1e-5) / (orders - 1))  # Mironov 2017, Prop. 3
    assert classic == pytest.approx(eps, abs=0.01)
    # what we report: Balle et al. 2020 (Thm. 21), computed here by hand from the same RDP curve
    balle = np.min(rdp + np.log((orders - 1) / orders) - (np.log(1e-5) + np.log(orders)) / (orders - 1))
    got = dp_sgd.epsilon([(sigma, q, steps)], 1e-5)
    assert got == pytest.approx(balle, rel=1e-9) and got < classic


@pytest.mark.optional_deps("opacus")
def test_dp_sgd_without_noise_or_clipping_is_plain_sgd(digits_root):
    cfg = parse_config(cli(digits_root, digits_root, "-dp", "-dps", "1", "--dp_clip", "1e9", "-gr", "1",
                                "--executor", "sequential"))
    from utils.data_utils import load_split
    from flcore.clients.clientbase import Client, ClientDeclares

    data = load_split("Digits", digits_root)
    with torch_seeded(0, 0, "model"):
        model = DNN(64, 10)
    client = Client(cfg, 0, data.clients[0], model)
    client.dp.sigma = 0.0
    x, y = client.x_train[:7], client.y_train[:7]
    loss = dp_sgd.dp_backward(client, client.loss, client.optimizer, x, y)
    ref = dlg.model_gradient(client.model, x, y)
    for n, p in client.model.named_parameters():
        assert torch.allclose(p.grad, ref[n], atol=1e-6), n
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(client.model(x), y).item(), rel=1e-5)
    assert client.dp.history == [(0.0, cfg.batch_size / client.train_samples, 1)]


@pytest.mark.optional_deps("opacus")
def test_dp_sgd_privatises_the_modules_the_client_names_and_refuses_others(digits_root):
    """The seam: DP-SGD's per-sample gradients reach every module ``declares.dp_modules`` names (here a second module
    trained beside the model: without noise or clipping its gradient is the plain one), and a parameter the
    optimizer trains outside those modules is refused instead of stepped without privacy."""
    cfg = parse_config(cli(digits_root, digits_root, "-dp", "-dps", "1", "--dp_clip", "1e9", "-gr", "1",
                                "--executor", "sequential"))
    from utils.data_utils import load_split
    from flcore.clients.clientbase import Client, ClientDeclares

    class TwoModules(Client):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            with torch_seeded(0, 0, "extra"):
                self.extra = torch.nn.Linear(10, 10)
            self.both = torch.optim.SGD([*self.model.parameters(), *self.extra.parameters()], lr=0.1)

        def stacked(self, x, y):
            return self.loss_fn(self.extra(self.model(x)), y)

    class Declared(TwoModules):
        declares = ClientDeclares(dp_modules=("model", "extra"))

    data = load_split("Digits", digits_root)
    with torch_seeded(0, 0, "model"):
        model = DNN(64, 10)
    undeclared = TwoModules(cfg, 0, data.clients[0], model)
    x, y = undeclared.x_train[:7], undeclared.y_train[:7]
    with pytest.raises(ValueError, match="2 parameter.*outside the modules named for DP-SGD"):
        dp_sgd.dp_backward(undeclared, undeclared.stacked, undeclared.both, x, y)
    client = Declared(cfg, 0, data.clients[0], model)
    client.dp.sigma = 0.0
    dp_sgd.dp_backward(client, client.stacked, client.both, x, y)
    params = [*client.model.parameters(), *client.extra.parameters()]
    ref = torch.autograd.grad(client.stacked(x, y), params)
    assert all(torch.allclose(p.grad, r, atol=1e-6) for p, r in zip(params, ref))
    assert client.extra.weight.grad.abs().sum() > 0


@pytest.mark.optional_deps("opacus")
def test_dp_refuses_batchnorm():
    from flcore.trainmodel.models import resnet18

    cfg = parse_config(["-dp", "-gr", "1"])
    with pytest.raises(FLError, match="BatchNorm"):
        dp_sgd.DPSGD.from_config(cfg, 0, 0, resnet18(1, 10), 100)
    with pytest.raises(FLError, match="-dps must be > 0"):
        parse_config(["-dp", "-dps", "0"])  # parsing validates
    cfg = parse_config(["-dp", "-gr", "1"])
    from plugins.dp_sample import SampleDP

    SampleDP.check(cfg.replace(dp_sigma=0.5), None, set())
    SampleDP.check(cfg.replace(privacy=False, dp_sigma=0.0), None, set())  # sigma 0 is fine without -dp
    with pytest.raises(FLError, match="-dps must be > 0"):
        SampleDP.check(cfg.replace(dp_sigma=0.0), None, set())


# ---- inside a run --------------------------------------------------------------------------------------
def test_dlg_in_a_fedala_run_writes_series_and_grid(digits_root, tmp_path):
    flags = cli(digits_root, tmp_path, "-algo", "FedALA", "-gr", "2", "-lr", "0.1", "-dlg", "-dlgg", "1",
                "--dlg_iters", "20", "-bnpc", "1", "--dlg_clients", "1")
    assert main.main(flags) == 0
    h5 = read_h5(tmp_path / "Digits_FedALA_test_0.h5")
    assert h5["rs_dlg_round"].tolist() == [0, 1]
    for key in ("rs_dlg_psnr", "rs_dlg_ssim", "rs_dlg_label_acc", "rs_dlg_psnr_max", "rs_dlg_images",
                "rs_dlg_psnr_guess", "rs_dlg_ssim_guess"):
        assert len(h5[key]) == 2 and np.all(np.isfinite(h5[key])), key
    # One image per attack on a textbook gradient of the 64-input MLP: even 20 L-BFGS steps of DLG recover
    # it (PSNR about 25 dB against about 8 for the grey guess, SSIM about 0.99) and its label; a broken
    # attack, target or matching lands near the guess.
    assert h5["rs_dlg_label_acc"].tolist() == [1.0, 1.0] and h5["rs_dlg_images"].tolist() == [1.0, 1.0]
    assert np.all(h5["rs_dlg_psnr"] > h5["rs_dlg_psnr_guess"] + 10), (h5["rs_dlg_psnr"], h5["rs_dlg_psnr_guess"])
    assert np.all(h5["rs_dlg_ssim"] > 0.9) and np.all(h5["rs_dlg_ssim"] <= 1)
    assert np.all(h5["rs_dlg_ssim_guess"] < 0.1) and np.all(h5["rs_dlg_psnr_max"] >= h5["rs_dlg_psnr"])
    assert (tmp_path / "Digits_FedALA_test_0_dlg_r0.png").stat().st_size > 1000
    assert (tmp_path / "Digits_FedALA_test_0_dlg_r1.png").exists()


def test_dlg_leaves_training_untouched(digits_root, tmp_path):
    """The attack works on copies and its own random streams: the learning curve is the same."""
    runs = []
    for sub, extra in (("plain", []), ("dlg", ["-dlg", "-dlgg", "1", "--dlg_iters", "5", "-bnpc", "1"])):
        assert main.main(cli(digits_root, tmp_path / sub, "-gr", "2", "-lr", "0.1", *extra)) == 0
        runs.append(read_h5(tmp_path / sub / "Digits_FedAvg_test_0.h5"))
    assert np.array_equal(runs[0]["rs_test_acc"], runs[1]["rs_test_acc"])
    assert np.array_equal(runs[0]["rs_train_loss"], runs[1]["rs_train_loss"])


@pytest.mark.optional_deps("opacus")
def test_dp_run_records_epsilon_per_client(digits_root, tmp_path):
    """FedALA with DP-SGD (FedAvg's client is the base one, tested above): two rounds, epsilon per client
    from the steps each took so far (round 2: twice round 1's), and an attack on the DP-trained upload."""
    flags = cli(digits_root, tmp_path, "-algo", "FedALA", "-gr", "2", "-lr", "0.1", "-dp", "-dps", "1.5",
                "--dlg_target", "update", "-dlg", "--dlg_iters", "5", "-bnpc", "1", "--dlg_clients", "1")
    assert main.main(flags) == 0
    h5 = read_h5(tmp_path / "Digits_FedALA_test_0.h5")
    from utils.data_utils import load_split

    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
    from opacus.accountants.rdp import RDPAccountant

    def rdp_epsilon(q: float, steps: int) -> float:  # opacus' RDP analysis, without dp_sgd.epsilon
        orders = RDPAccountant.DEFAULT_ALPHAS
        rdp = compute_rdp(q=q, noise_multiplier=1.5, steps=steps, orders=orders)
        return get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)[0]

    sizes = [len(c.y_train) for c in load_split("Digits", digits_root).clients]
    # r rounds of one epoch of ceil(n / 10) batches of -lbs 10, each at q = 10 / n
    want = [[rdp_epsilon(10 / n, r * math.ceil(n / 10)) for n in sizes] for r in (1, 2)]
    assert h5["rs_round"].tolist() == [0, 1, 2]
    assert h5["rs_dp_client_epsilon"].tolist()[0] == [0.0] * 5  # before any training
    assert np.allclose(h5["rs_dp_client_epsilon"][1], want[0])
    assert np.allclose(h5["rs_dp_client_epsilon"][2], want[1])
    assert np.all(h5["rs_dp_client_epsilon"][2] > h5["rs_dp_client_epsilon"][1])
    eps_max, eps_mean = h5["rs_dp_epsilon_max"], h5["rs_dp_epsilon_mean"]
    assert eps_max[0] == 0 and 0 < eps_max[1] < eps_max[2] and 0 < eps_mean[1] < eps_mean[2]
    assert eps_max[1] == pytest.approx(max(want[0])) and eps_mean[2] == pytest.approx(np.mean(want[1]))
    assert h5["rs_dlg_round"].tolist() == [0] and np.isfinite(h5["rs_dlg_psnr"][0])


def test_dlg_needs_images(tmp_path, capsys):
    from dataset import generate_Synthetic

    assert generate_Synthetic.main(["--root", str(tmp_path), "--num-clients", "3"]) == 0
    flags = ["-data", "Synthetic", "--dataset_root", str(tmp_path), "--results_dir", str(tmp_path / "o"),
             "-dev", "cpu", "--no-progress", "-gr", "1", "-dlg"]
    capsys.readouterr()
    assert main.main(flags) == 2
    err = capsys.readouterr().err
    assert "-dlg reconstructs images" in err and "'Synthetic'" in err and "[60]" in err, err
    assert err.count("\n") == 1  # one line, no traceback
    assert not list((tmp_path / "o").glob("*.h5"))  # refused before any round ran
    assert main.main(flags[:-1]) == 0  # the same run without -dlg is fine
    assert len(read_h5(tmp_path / "o" / "Synthetic_FedAvg_test_0.h5")["rs_test_acc"]) == 2


def test_privatize_handles_scalar_parameters():
    """A 0-d parameter (APFL's alpha could be one) has per-sample gradients of shape (B,): its entries count
    in each sample's norm like any other coordinate."""
    grads = {"alpha": torch.tensor([3.0, 0.0]), "w": torch.tensor([[4.0, 0.0], [0.0, 0.5]])}
    out = dp_sgd.privatize(grads, 1.0, 0.0, torch.Generator().manual_seed(0))
    # sample 0: norm 5 -> scaled by 1/5; sample 1: norm 0.5 -> kept; then the mean over the batch
    assert torch.allclose(out["alpha"], torch.tensor((3.0 / 5 + 0.0) / 2), atol=1e-5)
    assert torch.allclose(out["w"], torch.tensor([4.0 / 5 / 2, 0.5 / 2]), atol=1e-5)


def test_pseudo_gradient_of_several_steps_is_the_mean_step():
    start = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    g = [torch.tensor([0.3, -0.6]), torch.tensor([0.9, 0.0]), torch.tensor([-0.3, 1.2])]  # three steps at lr 0.2
    after = {"w": start["w"] - 0.2 * sum(g), "b": start["b"]}
    back = dlg.pseudo_gradient(start, after, lr=0.2, steps=3, names=["w"])
    assert list(back) == ["w"]
    torch.testing.assert_close(back["w"], torch.tensor([0.3, 0.2]))  # (g1 + g2 + g3) / 3


def test_update_target_of_a_round_of_several_steps(digits_tiny_root, monkeypatch):
    """The attacked target of --dlg_target update is (W_start - W_up) / (lr · K), K = -ls · ceil(n / -lbs)."""
    from flcore.registry import get_server_class
    from utils.data_utils import load_split

    cfg = parse_config(cli(digits_tiny_root, digits_tiny_root, "-algo", "FedAvg", "--executor", "sequential",
                                "-lr", "0.05", "-lbs", "20", "-ls", "2", "-nc", "3", "-dlg", "-dlgg", "1",
                                "--dlg_iters", "1", "-bnpc", "1", "--dlg_clients", "1", "--dlg_target", "update"))
    data = load_split("Digits", digits_tiny_root, 3)
    server = get_server_class("FedAvg")(cfg.replace(num_classes=data.num_classes), data, 0, None)
    start = {k: v.clone() for k, v in server.global_model.state_dict().items()}
    targets, uploads = [], []
    attack = dlg.reconstruct
    monkeypatch.setattr(dlg, "reconstruct", lambda model, target, *a, **k: targets.append(target) or
                        attack(model, target, *a, **k))
    receive = loop.receive
    monkeypatch.setattr(loop, "receive", lambda srv, cs: uploads.extend(receive(srv, cs)) or uploads[-len(cs):])
    loop.run_round(server, 0)
    assert len(targets) == 1
    n = {c.id: c.train_samples for c in server.clients}
    matches = []
    for u in uploads:
        k = 2 * math.ceil(n[u.id] / 20)
        assert k > 2  # several steps per epoch
        want = {name: (start[name] - u.state[name]) / (0.05 * k) for name in targets[0]}
        matches.append(all(torch.allclose(targets[0][name], want[name], atol=1e-6) for name in want))
    assert sum(matches) == 1  # the attacked client's (and nobody else's)


def test_a_parameter_the_forward_does_not_use_gets_a_zero_gradient(digits_tiny_root, tmp_path):
    """GPFL's conditional embedding and PFL-DA's global head are trained by the algorithms' own losses,
    not by the plain forward: their cross-entropy gradient is zero (the attack ran into an autograd error
    on them in round 0)."""
    class Partly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.unused = torch.nn.Linear(3, 2), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    torch.manual_seed(0)
    model = Partly()
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    grads = dlg.model_gradient(model, x, y)
    w, b = model.fc.weight, model.fc.bias
    p = torch.softmax(x @ w.T + b, dim=1) - torch.nn.functional.one_hot(y, 2)  # d CE / d logits, times 5
    assert torch.allclose(grads["fc.weight"], p.T @ x / 5, atol=1e-6)
    assert torch.allclose(grads["fc.bias"], p.sum(0) / 5, atol=1e-6)
    assert torch.equal(grads["unused.weight"], torch.zeros(4, 4)) and torch.equal(grads["unused.bias"], torch.zeros(4))
    for algo in ("GPFL", "PFL-DA"):
        assert main.main(cli(digits_tiny_root, tmp_path, "-algo", algo, "-gr", "1", "-dlg", "--dlg_iters", "5",
                             "--dlg_clients", "1", "--executor", "sequential", "-go", algo)) == 0


def test_dp_sgd_sampling_rate_by_hand():
    """q = min(1, max(B, len(x)) / min(n, pool)): B over the samples the batch is drawn from, capped at 1 for a
    client holding fewer samples than a batch; equal consecutive steps are merged into one history entry."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 0])

    def steps(n, batch, pool, x=x, y=y):
        dp = dp_sgd.DPSGD(1.0, 0.0, n, batch, torch.Generator().manual_seed(0))
        for _ in range(2):
            dp.backward({"net": model}, lambda xb, yb: F.cross_entropy(model(xb), yb), opt, x, y, pool=pool)
        return dp.history

    assert steps(n=3, batch=10, pool=3) == [(0.0, 1.0, 2)]        # 10 / 3 capped at 1
    assert steps(n=8, batch=2, pool=8) == [(0.0, 3 / 8, 2)]       # the batch holds 3 > B = 2 samples
    assert steps(n=20, batch=4, pool=8) == [(0.0, 4 / 8, 2)]      # drawn from a pool of 8 of the 20
    assert steps(n=6, batch=4, pool=8) == [(0.0, 4 / 6, 2)]       # ... but never from more than n
    assert steps(n=1, batch=1, pool=1, x=x[:1], y=y[:1]) == [(0.0, 1.0, 2)]  # one sample: every step sees it
    dp = dp_sgd.DPSGD(1.0, 0.0, 20, 4, torch.Generator().manual_seed(0))
    for pool in (8, 10, 10, 10, 8):  # a new rate starts a new entry; a repeated one extends the last entry only
        dp.backward({"net": model}, lambda xb, yb: F.cross_entropy(model(xb), yb), opt, x, y, pool=pool)
    assert dp.history == [(0.0, 0.5, 1), (0.0, 0.4, 3), (0.0, 0.5, 1)]


@pytest.mark.optional_deps("opacus")
def test_dp_sgd_streams_and_refusal_name_by_hand():
    """The training noise stream is (seed, run, "dp-noise", client id); --dp_secure_rng replaces it with an
    OS-seeded one, a config without that flag keeps the seeded stream; a BatchNorm refusal names the first
    BatchNorm layer."""
    model = nn.Linear(2, 2)
    cfg = parse_config(["-dp", "-gr", "1", "--seed", "4"]).replace(device="cpu")
    dp = dp_sgd.DPSGD.from_config(cfg, 3, 1, model, 50)
    assert dp.secure is None
    assert torch.equal(torch.randn(5, generator=dp.generator), torch.randn(5, generator=torch_gen(4, 1, "dp-noise", 3)))
    bare = type("Cfg", (), {k: getattr(cfg, k) for k in ("privacy", "dp_level", "dp_clip", "dp_sigma", "seed",
                                                         "batch_size", "device") if hasattr(cfg, k)})()
    assert not hasattr(bare, "dp_secure_rng") and dp_sgd.DPSGD.from_config(bare, 3, 1, model, 50).secure is None
    secure = dp_sgd.DPSGD.from_config(cfg.replace(dp_secure_rng=True), 3, 1, model, 50).secure
    assert secure is not None and secure.initial_seed() != torch.Generator().initial_seed()
    two = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1))
    with pytest.raises(FLError, match="the model has BatchNorm1d layers"):
        dp_sgd.DPSGD.from_config(cfg, 0, 0, two, 100)


@pytest.fixture
def shown(monkeypatch):
    """The figures save_grid draws, caught as it closes them."""
    import matplotlib.pyplot as plt

    caught = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (caught.append(fig), close(fig)))
    return caught


@pytest.mark.parametrize("channels,count", [(1, 3), (3, 10)])
def test_the_grid_shows_originals_over_reconstructions_as_drawn_here(channels, count, tmp_path, shown):
    """save_grid's figure, caught before it is closed: two rows of min(count, 8) untickmarked panels, the
    originals on top and the reconstructions below, each image drawn as given (grey scale for one channel)
    on the fixed range [0, 1], the titles under the reconstructions, the row labels; 1.4 x 3.0 inches per
    column at 80 dpi in the file."""
    import matplotlib.image
    import numpy as np

    orig = torch.rand(count, channels, 5, 4, generator=torch_gen(0, 0, "o"))
    recon = torch.rand(count, channels, 5, 4, generator=torch_gen(0, 0, "r"))
    titles = [f"{i} dB" for i in range(count)]
    dlg.save_grid(orig, recon, tmp_path / "grid.png", titles)
    k = min(count, 8)
    (fig,) = shown
    axes = fig.axes
    assert len(axes) == 2 * k and tuple(fig.get_size_inches()) == pytest.approx((1.4 * k, 3.0))
    for j in range(k):
        for row, img in ((0, orig[j]), (1, recon[j])):
            ax = axes[row * k + j]
            (im,) = ax.get_images()
            want = img.permute(1, 2, 0).numpy()
            drawn, given = np.asarray(im.get_array()), want[..., 0] if channels == 1 else want
            assert drawn.shape == given.shape and np.allclose(drawn, given)
            assert im.get_clim() == (0, 1) and im.get_cmap().name == "gray"
            assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
        assert axes[k + j].get_title() == titles[j] and axes[k + j].title.get_fontsize() == 7
        assert axes[j].get_title() == ""
    assert axes[0].get_ylabel() == "original" and axes[k].get_ylabel() == "recon."
    assert axes[0].yaxis.label.get_fontsize() == 8 and axes[k].yaxis.label.get_fontsize() == 8
    png = matplotlib.image.imread(tmp_path / "grid.png")
    assert png.shape[:2] == (round(3.0 * 80), round(1.4 * k * 80))


def test_the_grid_without_titles_has_none(tmp_path, shown):
    dlg.save_grid(torch.rand(2, 1, 4, 4), torch.rand(2, 1, 4, 4), tmp_path / "g.png")
    assert all(ax.get_title() == "" for ax in shown[0].axes) and (tmp_path / "g.png").exists()


@pytest.mark.parametrize("size,window,bright", [(8, 7, 2.0), (12, 11, 2.0), (13, 11, 2.0), (9, 9, 2.0), (8, 7, 0.02)])
def test_ssim_against_a_loop_over_every_window(size, window, bright):
    """SSIM by the paper's definition, one valid window at a time: Gaussian weights exp(-d^2 / (2 * 1.5^2))
    normalised over the window (7 x 7 on 8 x 8 images, the largest odd size that fits; 11 x 11 at most), the
    weighted means, variances and covariance, C1 = (0.01 L)^2, C2 = (0.03 L)^2, averaged over the positions and
    the channels; two channels, data range 2 (dark images too, where the constants weigh most)."""
    a = torch.rand(2, 2, size, size, generator=torch_gen(0, 0, "a"), dtype=torch.float64) * bright
    noise = 0.15 * bright * torch.randn(2, 2, size, size, generator=torch_gen(0, 0, "b"), dtype=torch.float64)
    b = (a + noise).clamp(0, bright)
    r = torch.arange(window, dtype=torch.float64) - (window - 1) / 2
    g = torch.exp(-r ** 2 / (2 * 1.5 ** 2))
    w = g[:, None] * g[None, :]
    w = w / w.sum()
    c1, c2 = (0.01 * 2) ** 2, (0.03 * 2) ** 2
    want = []
    for n in range(2):
        values = []
        for c in range(2):
            for i in range(size - window + 1):
                for j in range(size - window + 1):
                    pa, pb = a[n, c, i:i + window, j:j + window], b[n, c, i:i + window, j:j + window]
                    ma, mb = (w * pa).sum(), (w * pb).sum()
                    va, vb = (w * pa * pa).sum() - ma ** 2, (w * pb * pb).sum() - mb ** 2
                    cov = (w * pa * pb).sum() - ma * mb
                    values.append(((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2)))
        want.append(float(sum(values) / len(values)))
    assert dlg.ssim(a, b, data_range=2.0).tolist() == pytest.approx(want, rel=1e-5)


def test_denormalize_by_hand_and_clamped_to_the_pixel_range():
    """(x * std + mean) per channel, then clamped to [0, 1]: channel 0 (mean 0.5, std 0.5) and channel 1
    (mean 0.2, std 2)."""
    x = torch.tensor([[[[-3.0, 0.0]], [[0.1, 1.0]]]])  # 1 x 2 x 1 x 2
    got = dlg.denormalize(x, [0.5, 0.2], [0.5, 2.0])
    assert torch.allclose(got, torch.tensor([[[[0.0, 0.5]], [[0.4, 1.0]]]]))  # -1 clamped to 0, 2.2 to 1


def test_matching_near_identical_images_survives_rounding():
    """Reconstructions 1e-9 from their originals: the expanded squared distance |r|^2 - 2 r.o + |o|^2 comes out
    slightly negative for one of these (rounding; without the floor its PSNR is NaN and the assignment
    fails); floored, every pair scores MAX_PSNR and pairs with its own original."""
    o = torch.rand(3, 1, 8, 8, generator=torch_gen(0, 0, "m"), dtype=torch.float64) * 3
    r = o + 1e-9
    order, score = dlg.match(o, r)
    assert order.tolist() == [0, 1, 2] and score.tolist() == [dlg.MAX_PSNR] * 3


def test_the_grid_draws_off_screen_tensors_that_require_grad_tightly_laid_out(tmp_path, shown):
    """Whatever backend was chosen before, the grid is drawn with the non-interactive Agg (no window opens on
    a desktop); reconstructions still attached to a graph are drawn; the panels are laid out tightly (margins
    inside matplotlib's default subplot margins, left and top)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("pdf")
    try:
        recon = torch.rand(2, 1, 4, 4).requires_grad_(True)
        dlg.save_grid(torch.rand(2, 1, 4, 4), recon, tmp_path / "g.png", ["a", "b"])
        assert matplotlib.get_backend().lower() == "agg"
    finally:
        matplotlib.use(before)
    box = shown[0].axes[0].get_position()
    assert box.x0 < matplotlib.rcParams["figure.subplot.left"] and box.y1 > matplotlib.rcParams["figure.subplot.top"]


def test_dp_defaults_and_a_missing_accountant_named_only_with_dp(monkeypatch):
    """-dps 1.0, --dp_clip 1.0, --dp_delta 1e-5 (the README's table); without opacus, -dp stops with one line
    naming the install command, and a run without -dp does not need opacus."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "opacus" else real(name, *a))
    with pytest.raises(FLError, match=r"^-dp reports epsilon with opacus' RDP accountant, which is not installed: "
                                      r"pip install -r requirements-optional.txt$"):
        parse_config(["-dp"])
    assert parse_config([]).privacy is False
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("opacus") is not None:
        cfg = parse_config(["-dp"])
        assert (cfg.dp_sigma, cfg.dp_clip, cfg.dp_delta) == (1.0, 1.0, 1e-5)
