"""Inverting Gradients (Geiping et al. 2020, ``-dlga ig``): its cost terms by hand, a reconstruction that beats a
random guess only when the gradient matching works, and the attack inside a run."""
import math

import pytest
import torch
from torch import nn

import main
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
