"""Aggregation against hand-computed numbers."""
import pytest
import torch
from torch import nn

from utils.aggregate import squared_distances, weighted_average


def test_weighted_average_matches_hand_computation():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(3.0)}
    b = {"w": torch.tensor([4.0, 8.0]), "b": torch.tensor(-3.0)}
    out = weighted_average([a, b], [1, 2])  # weights 1/3, 2/3
    assert torch.allclose(out["w"], torch.tensor([3.0, 6.0]))
    assert torch.allclose(out["b"], torch.tensor(-1.0))


def test_batchnorm_statistics_are_averaged():
    m1, m2 = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
    m1.running_mean.fill_(1.0)
    m2.running_mean.fill_(4.0)
    m1.running_var.fill_(2.0)
    m2.running_var.fill_(5.0)
    m1.num_batches_tracked.fill_(10)
    m2.num_batches_tracked.fill_(20)
    out = weighted_average([m1.state_dict(), m2.state_dict()], [3, 1])
    assert torch.allclose(out["running_mean"], torch.full((2,), 1.75))
    assert torch.allclose(out["running_var"], torch.full((2,), 2.75))
    assert int(out["num_batches_tracked"]) == 12  # 0.75*10 + 0.25*20 = 12.5 -> rounded half to even
    assert out["num_batches_tracked"].dtype == torch.long


def test_bad_weights_rejected():
    with pytest.raises(ValueError):
        weighted_average([{"w": torch.zeros(1)}], [0])
    with pytest.raises(ValueError):
        weighted_average([{"w": torch.zeros(1)}], [1, 2])


def test_integer_entries_round_rather_than_truncate_and_keys_restrict():
    a = {"n": torch.tensor(10), "w": torch.tensor([1.0]), "skip": torch.tensor([5.0])}
    b = {"n": torch.tensor(20), "w": torch.tensor([4.0]), "skip": torch.tensor([7.0])}
    out = weighted_average([a, b], [1, 2], keys=["n", "w"])  # n: 10/3 + 40/3 = 16.67 -> 17 (truncating: 16)
    assert set(out) == {"n", "w"} and int(out["n"]) == 17 and out["n"].dtype == torch.int64
    assert torch.allclose(out["w"], torch.tensor([3.0]))
    with pytest.raises(ValueError):
        weighted_average([a, b], [-1, 2])


def test_one_state_is_its_own_average_and_none_is_an_error():
    only = {"w": torch.tensor([2.0, -1.0])}
    assert torch.equal(weighted_average([only], [7])["w"], only["w"])
    with pytest.raises(ValueError, match="at least one state"):
        weighted_average([], [])


def test_the_average_of_live_parameters_holds_no_autograd_graph():
    a, b = nn.Linear(2, 1), nn.Linear(2, 1)  # parameters require grad, as uploads of a model's own tensors do
    out = weighted_average([dict(a.named_parameters()), dict(b.named_parameters())], [1, 3])
    assert not any(t.requires_grad for t in out.values())
    torch.testing.assert_close(out["weight"], (a.weight + 3 * b.weight).detach() / 4)


def test_zero_and_fractional_weights_are_accepted():
    a, b = {"w": torch.tensor([4.0])}, {"w": torch.tensor([8.0])}
    assert torch.equal(weighted_average([a, b], [0, 2])["w"], torch.tensor([8.0]))  # a zero weight drops a state
    assert torch.equal(weighted_average([a, b], [0.25, 0.75])["w"], torch.tensor([7.0]))  # weights already summing to 1


def loop_distances(x: torch.Tensor) -> torch.Tensor:
    """The reference: each pair's difference summed in float64, +inf on the diagonal."""
    x, n = x.double(), len(x)
    return torch.tensor([[float("inf") if i == j else float(((x[i] - x[j]) ** 2).sum()) for j in range(n)]
                         for i in range(n)], dtype=torch.float64)


@pytest.mark.parametrize("offset, spread", [(0.0, 1.0), (0.0, 1e-3), (1e3, 1e-2)])
def test_squared_distances_match_a_float64_loop(offset, spread):
    """Small and large distances, and rows far from the origin (a common offset 10^5 times their spread:
    the Gram matrix taken relative to a row keeps the cancellation to the spread). Equal rows are 0 apart up
    to the product's rounding, the matrix is symmetric bit for bit, a row is not its own neighbour."""
    gen = torch.Generator().manual_seed(0)
    x = offset + spread * torch.randn(6, 50, generator=gen)
    x[4] = x[3]
    got = squared_distances(x)
    want = loop_distances(x)
    typical = want[torch.isfinite(want) & (want > 0)].median()
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-6 * float(typical))
    assert want[3, 4] == 0 and got[3, 4] <= 1e-6 * typical and torch.equal(got, got.T)
    assert torch.isinf(got.diagonal()).all() and got.dtype == x.dtype


def test_squared_distances_of_small_integers_are_exact():
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0], [-2.0, 5.0]])
    inf = float("inf")
    assert squared_distances(x).tolist() == [[inf, 25, 2, 29], [25, inf, 13, 26], [2, 13, inf, 25],
                                             [29, 26, 25, inf]]


def test_squared_distances_are_never_negative():
    """Rows a rounding error apart: G_ii + G_jj - 2 G_ij can come out below 0 in floating point; the floor
    keeps every distance at 0 or above (a negative one would make Krum's scores meaningless)."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):  # rows 1-7 within 1e-7 of each other: unfloored, about 4 cases in 10 go below 0 here
        x = 100 * torch.randn(1, 50, generator=gen) + 1e-3 * torch.randn(8, 50, generator=gen)
        x[2:] = x[1] + 1e-7 * torch.randn(6, 50, generator=gen)
        assert (squared_distances(x) >= 0).all()
