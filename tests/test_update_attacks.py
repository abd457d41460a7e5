"""Omniscient update-space attacks (--attack alie|ipm|minmax|minsum, utils/update_attacks.py) against numbers
worked out by hand, and on a real server against a reference loop over the uploads written here."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from conftest import plugin
from test_attacks import uploads_before_and_after_the_attack
from utils import update_attacks as ua

T = torch.float64


def test_alie_z_from_n_and_f():
    # n = 20, f = 4: s = floor(11) - 4 = 7, z = Φ⁻¹(13 / 20); n = 50, f = 24: s = 2, z = Φ⁻¹(48 / 50) ≈ 1.75
    assert ua.alie_z(20, 4) == pytest.approx(norm.ppf(0.65), abs=1e-12)
    assert ua.alie_z(20, 4) == pytest.approx(0.38532, abs=1e-5)
    assert ua.alie_z(50, 24) == pytest.approx(1.75069, abs=1e-5)
    assert ua.alie_z(5, 2) == pytest.approx(norm.ppf(0.8), abs=1e-12)  # s = floor(3.5) - 2 = 1
    for n, f in ((4, 3), (1, 0)):  # s = 0 (a malicious majority), s = n
        with pytest.raises(ValueError, match="0 < s < n"):
            ua.alie_z(n, f)


def test_alie_by_hand():
    benign = torch.tensor([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0]], dtype=T)
    # μ = (3, 4); σ with Bessel's correction: sqrt((4 + 0 + 4) / 2) = 2, sqrt((4 + 4 + 16) / 2) = sqrt(12)
    z = norm.ppf(0.8)  # n = 5, f = 2
    want = [3 - z * 2, 4 - z * math.sqrt(12)]
    assert np.allclose(ua.alie(benign, 5, 2).numpy(), want, rtol=0, atol=1e-12)
    # one benign row: σ = 0, the attack is that row
    assert ua.alie(benign[:1], 5, 2).tolist() == [1.0, 2.0]


def test_ipm_by_hand():
    benign = torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=T)
    assert ua.ipm(benign, 0.1).tolist() == pytest.approx([-0.2, -0.1])
    assert ua.ipm(benign, 100.0).tolist() == pytest.approx([-200.0, -100.0])


def test_perturbations_by_hand():
    benign = torch.tensor([[0.0, -1.0, 2.0], [6.0, -3.0, 2.0]], dtype=T)  # μ = (3, -2, 2), ||μ|| = sqrt(17)
    assert np.allclose(ua.perturbation(benign, "unit_vec").numpy(), np.array([-3, 2, -2]) / math.sqrt(17))
    # σ: |a - b| / sqrt(2) for two rows: 6/√2, 2/√2, 0
    assert np.allclose(ua.perturbation(benign, "std").numpy(), -np.array([6, 2, 0]) / math.sqrt(2))
    assert ua.perturbation(benign, "sign").tolist() == [-1.0, 1.0, -1.0]
    assert ua.perturbation(torch.zeros(2, 3, dtype=T), "unit_vec").tolist() == [0.0, 0.0, 0.0]


def test_halving_search_finds_the_largest_accepted_gamma():
    # accepted up to 3: 10 no, 5 no, 2.5 yes, 3.75 no, 3.125 no, 2.8125 yes, ... -> just below 3
    g = ua.halving_search(lambda g: g <= 3.0)
    assert 3.0 - 2e-5 <= g <= 3.0
    assert ua.halving_search(lambda g: False) == 0.0
    g = ua.halving_search(lambda g: True)  # 10, 15, 17.5, ...: every step up, towards 20
    assert 20.0 - 2e-5 <= g < 20.0
    seen = []
    ua.halving_search(lambda g: seen.append(g) or g <= 3.0)
    assert seen[:6] == [10.0, 5.0, 2.5, 3.75, 3.125, 2.8125]  # ±γ_init/2, ±γ_init/4, ...


def test_min_max_and_min_sum_by_hand():
    """Benign updates 0, 1, 4 (one coordinate): μ = 5/3, ∇p (unit vector) = -1, so m = 5/3 - γ.
    Min-Max: the largest benign distance is 4 and m's farthest benign value is 4, at 7/3 + γ: γ = 5/3.
    Min-Sum: the largest benign sum of squared distances is 16 + 9 = 25 (at 4); m's is
    sum (b - μ)² + 3γ² = 26/3 + 3γ²: γ = 7/3."""
    benign = torch.tensor([[0.0], [1.0], [4.0]], dtype=T)
    assert ua.min_max(benign, "unit_vec").item() == pytest.approx(0.0, abs=3e-5)
    assert ua.min_max(benign, "unit_vec").item() >= 0.0  # γ from below: never past the bound
    assert ua.min_sum(benign, "unit_vec").item() == pytest.approx(5 / 3 - 7 / 3, abs=3e-5)
    assert ua.min_sum(benign, "unit_vec").item() >= 5 / 3 - 7 / 3


def test_min_max_with_the_std_perturbation_by_hand():
    """Benign (0, 0), (2, 0), (0, 2): μ = (2/3, 2/3), σ = (2/√3, 2/√3) (Bessel), ∇p = -σ, so
    m = (a, a), a = 2/3 - 2γ/√3. The largest benign distance is √8; m's farthest benign point is (2, 0) (or
    (0, 2)), at sqrt((2 - a)² + a²), which is √8 at a = 1 - √3: γ = (√3 - 1/3) √3 / 2."""
    benign = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]], dtype=T)
    gamma = (math.sqrt(3) - 1 / 3) * math.sqrt(3) / 2
    a = 2 / 3 - gamma * 2 / math.sqrt(3)
    assert a == pytest.approx(1 - math.sqrt(3))
    got = ua.min_max(benign, "std")
    assert np.allclose(got.numpy(), [a, a], atol=1e-4) and got[0] == got[1]
    assert float((benign - got).norm(dim=1).max()) <= math.sqrt(8)


@pytest.mark.parametrize("kind", ["alie", "ipm", "minmax", "minsum"])
def test_malicious_uploads_on_a_server_match_a_reference_loop(kind, digits_tiny_root, monkeypatch):
    """Round 0 of FedAvg with 2 of 5 clients malicious: each malicious upload is W + Δ on every parameter,
    Δ computed here from the benign uploads by a plain loop over entries (numpy), BatchNorm statistics and
    the benign uploads untouched."""
    server, sent, seen, glob = uploads_before_and_after_the_attack(digits_tiny_root, monkeypatch, "--attack", kind,
                                                                   "--attack_frac", "0.4")
    params = [k for k, _ in server.global_model.named_parameters()]
    bad = set(plugin(server, "Attack").malicious)
    good = [c for c in sent if c not in bad]
    assert len(bad) == 2 and len(good) == 3
    rows = np.stack([np.concatenate([(sent[c][k].double() - glob[k].double()).numpy().ravel() for k in params])
                     for c in good])
    mu, sd = rows.mean(0), rows.std(0, ddof=1)
    if kind == "alie":
        delta = mu - norm.ppf((5 - (5 // 2 + 1 - 2)) / 5) * sd  # n = 5, f = 2: s = 1, z = Φ⁻¹(0.8)
    elif kind == "ipm":
        delta = -0.1 * mu
    else:
        dev = -sd
        dists = np.linalg.norm(rows[:, None] - rows[None], axis=2)
        if kind == "minmax":
            ok = lambda g: np.linalg.norm(rows - (mu + g * dev), axis=1).max() <= dists.max()  # noqa: E731
        else:
            ok = lambda g: (np.linalg.norm(rows - (mu + g * dev), axis=1) ** 2).sum() <= (dists ** 2).sum(1).max()  # noqa: E731
        lo, hi = 0.0, 20.0  # bisection on the monotone acceptance: the boundary γ the search approaches
        for _ in range(60):
            lo, hi = ((lo + hi) / 2, hi) if ok((lo + hi) / 2) else (lo, (lo + hi) / 2)
        assert lo > 0
        delta = mu + lo * dev
    at = 0
    for k in params:
        n = glob[k].numel()
        want = glob[k].double().numpy().ravel() + delta[at:at + n]
        at += n
        for c in bad:
            tol = 1e-5 if kind in ("minmax", "minsum") else 1e-6
            assert np.allclose(seen[c][k].double().numpy().ravel(), want, rtol=0, atol=tol * max(1, abs(want).max())), (kind, c, k)
    for c in seen:
        for k in seen[c]:
            if c not in bad or k not in params:
                assert torch.equal(seen[c][k], sent[c][k]), (c, k)


def test_alie_with_a_malicious_majority_in_a_round_is_one_line(digits_tiny_root, tmp_path, capsys):
    """3 of 5 clients malicious: s = floor(3.5) - 3 = 0, no z exists; the run stops with one line and keeps
    the round-0 evaluation."""
    import main
    from conftest import cli

    assert main.main(cli(digits_tiny_root, tmp_path, "-gr", "1", "--attack", "alie", "--attack_frac", "0.6")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--attack alie, round 0: ALIE: n = 5 uploads with f = 3 malicious gives s = 0" in err[0]
    assert (tmp_path / "Digits_FedAvg_test_0.h5").exists()
