"""PFLlib's layout of the pat and iid partitions (--layout pfllib) and exdir's PFLlib minimum client size.

Expectations come from PFLlib's rule as stated in the partition module's docstring, worked out by hand:
class c goes to the first g = ceil(N k / C) clients that still hold fewer than k classes; within a class of
n samples and s owners every owner but the last gets int(n/s) (balanced) or an integer in
[int(max(n/s/10, least/C)), int(n/s)) (unbalanced) and the last owner gets the rest.
"""

import json

import numpy as np
import pytest

from dataset import generate_MNIST
from dataset.utils import dataset_utils as du
from dataset.utils import partition as P


def labels_of(sizes, seed=0):
    """Shuffled labels with sizes[c] samples of class c."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(len(sizes)), sizes)).astype(np.int64)


def counts_of(labels, parts):
    """[client, class] sample counts."""
    return np.array([np.bincount(labels[p], minlength=labels.max() + 1) for p in parts])


def class_sets(labels, parts):
    return [set(np.unique(labels[p]).tolist()) for p in parts]


def assert_exact_cover(parts, n):
    everything = np.concatenate(parts)
    assert len(everything) == n
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))


def cv(parts):
    sizes = np.array([len(p) for p in parts])
    return sizes.std() / sizes.mean()


# --- class groups, worked out by hand -----------------------------------------------------------------------

def test_tiny_case_four_clients_four_classes_two_each():
    # g = ceil(4*2/4) = 2. Class 0: clients 0, 1 (rooms 1 1 2 2); class 1: clients 0, 1 (rooms 0 0 2 2);
    # class 2: clients 2, 3; class 3: clients 2, 3.
    groups = P.pfllib_class_groups(4, 4, 2)
    assert [g.tolist() for g in groups] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    labels = labels_of([30, 40, 50, 60])
    parts = P.pathological(labels, 4, np.random.default_rng(0), class_per_client=2, balance=True, layout="pfllib")
    assert class_sets(labels, parts) == [{0, 1}, {0, 1}, {2, 3}, {2, 3}]
    # balanced shares: int(n/2) to the first owner, the rest to the second (odd sizes would differ by one)
    assert counts_of(labels, parts).tolist() == [[15, 20, 0, 0], [15, 20, 0, 0], [0, 0, 25, 30], [0, 0, 25, 30]]


@pytest.mark.parametrize("num_clients,num_classes,k", [(20, 10, 2), (12, 6, 3), (10, 10, 5), (8, 4, 2), (7, 7, 7)])
def test_groups_of_consecutive_clients_get_consecutive_classes(num_clients, num_classes, k):
    # With C divisible by k and N*k divisible by C, g = N*k/C clients in a row share k classes in a row:
    # client i holds classes k*(i // g) .. k*(i // g) + k - 1 (20 clients, k = 2: clients 0-3 hold {0, 1}).
    g = num_clients * k // num_classes
    expected = [set(range(k * (i // g), k * (i // g) + k)) for i in range(num_clients)]
    labels = labels_of([200 + 7 * c for c in range(num_classes)], seed=num_clients)
    for balance in (True, False):
        parts = P.pathological(labels, num_clients, np.random.default_rng(1), class_per_client=k, balance=balance,
                               layout="pfllib")
        assert class_sets(labels, parts) == expected
        assert_exact_cover(parts, len(labels))


def test_mnist_pattern_clients_zero_to_three_share_classes_zero_and_one():
    labels = labels_of([7000] * 10)
    for seed in range(3):
        held = class_sets(labels, P.pathological(labels, 20, np.random.default_rng(seed), 2, layout="pfllib"))
        assert held[:4] == [{0, 1}] * 4 and held[16:] == [{8, 9}] * 4
        assert len({frozenset(h) for h in held}) == 5


def test_groups_that_do_not_divide_leave_late_clients_fewer_classes():
    # 20 clients, 10 classes, k = 3: g = 6. Classes 0-2 fill clients 0-5, 3-5 fill 6-11, 6-8 fill 12-17,
    # and class 9 finds only clients 18 and 19 with room: they hold one class each.
    expected = [{0, 1, 2}] * 6 + [{3, 4, 5}] * 6 + [{6, 7, 8}] * 6 + [{9}] * 2
    assert [set(np.flatnonzero([i in g for g in P.pfllib_class_groups(20, 10, 3)]).tolist())
            for i in range(20)] == expected
    # 3 clients, 4 classes, k = 2: g = 2; classes 0, 1 -> clients 0, 1; classes 2, 3 -> client 2 alone.
    labels = labels_of([100] * 4)
    parts = P.pathological(labels, 3, np.random.default_rng(0), class_per_client=2, layout="pfllib")
    assert class_sets(labels, parts) == [{0, 1}, {0, 1}, {2, 3}]
    assert counts_of(labels, parts)[2].tolist() == [0, 0, 100, 100]


def test_groups_that_would_drop_classes_raise_instead():
    # 3 clients, 5 classes, k = 2: g = 2; classes 0, 1 use clients 0, 1 up, classes 2, 3 use client 2 up,
    # and PFLlib would drop class 4's samples. The library layout covers this setting.
    labels = labels_of([50] * 5)
    with pytest.raises(P.PartitionError, match=r"before class position 4.*drop 1 of the 5 classes.*--layout library"):
        P.pathological(labels, 3, np.random.default_rng(0), class_per_client=2, layout="pfllib")
    assert_exact_cover(P.pathological(labels, 3, np.random.default_rng(0), class_per_client=2), len(labels))


# --- shares ---------------------------------------------------------------------------------------------------

def test_iid_balanced_gives_the_remainder_to_the_last_client():
    labels = labels_of([103, 50, 41])
    parts = P.iid(labels, 4, np.random.default_rng(0), balance=True, layout="pfllib")
    # 103 = 25+25+25+28, 50 = 12+12+12+14, 41 = 10+10+10+11
    assert counts_of(labels, parts).T.tolist() == [[25, 25, 25, 28], [12, 12, 12, 14], [10, 10, 10, 11]]
    # the library layout spreads the remainder instead (sizes differ by at most one per class)
    lib = counts_of(labels, P.iid(labels, 4, np.random.default_rng(0), balance=True))
    assert (lib.max(axis=0) - lib.min(axis=0) <= 1).all()


def test_iid_unbalanced_draw_range_and_remainder():
    labels = labels_of([1000] * 10)
    parts = P.iid(labels, 20, np.random.default_rng(5), balance=False, least_samples=40, layout="pfllib")
    assert_exact_cover(parts, len(labels))
    counts = counts_of(labels, parts)
    # n/s = 50: clients 0-18 draw from [int(max(5, 40/10)), 50) = [5, 49]; client 19 takes the rest
    assert counts[:19].min() >= 5 and counts[:19].max() <= 49
    np.testing.assert_array_equal(counts[19], 1000 - counts[:19].sum(axis=0))
    assert len(np.unique(counts[:19])) > 20  # really drawn, not one fixed share


def test_least_samples_raises_the_lower_end_of_the_draw():
    labels = labels_of([1000] * 10)
    counts = counts_of(labels, P.iid(labels, 20, np.random.default_rng(5), least_samples=300, layout="pfllib"))
    assert counts[:19].min() >= 30  # int(max(50/10, 300/10)) = 30


def test_unbalanced_pfllib_iid_gives_half_the_data_to_the_last_client():
    # expected last share: 1 - 19 * mean(draw) / 1000 with draws uniform on [5, 49], mean 27 -> 0.487
    labels = labels_of([1000] * 10)
    for seed in range(5):
        pf = P.iid(labels, 20, np.random.default_rng(seed), least_samples=40, layout="pfllib")
        lib = P.iid(labels, 20, np.random.default_rng(seed), least_samples=40)
        assert 0.43 < len(pf[19]) / len(labels) < 0.55
        assert max(len(p) for p in lib) / len(labels) < 0.1
        assert cv(pf) > 1.5 and cv(lib) < 0.4


def test_unbalanced_pfllib_pat_is_far_more_uneven_than_the_library_layout():
    labels = labels_of([7000] * 10)  # MNIST-sized
    pf_cv, lib_cv = [], []
    for seed in range(5):
        pf = P.pathological(labels, 20, np.random.default_rng(seed), 2, least_samples=40, layout="pfllib")
        lib = P.pathological(labels, 20, np.random.default_rng(seed), 2, least_samples=40)
        assert_exact_cover(pf, len(labels))
        sizes = np.array([len(p) for p in pf])
        # the last client of each group of four takes both remainders: each about 7000 - 3 * 963 = 4111
        assert (sizes[3::4] > sizes.reshape(5, 4)[:, :3].max(axis=1)).all()
        assert sizes[3::4].sum() / len(labels) > 0.45  # expected 0.59
        pf_cv.append(cv(pf))
        lib_cv.append(cv(lib))
    assert min(pf_cv) > max(lib_cv) and np.mean(pf_cv) > 2 * np.mean(lib_cv)


def test_same_seed_same_split_and_balanced_draws_nothing_random_but_the_samples():
    labels = labels_of([300] * 10)
    a = P.pathological(labels, 10, np.random.default_rng(3), 2, layout="pfllib")
    b = P.pathological(labels, 10, np.random.default_rng(3), 2, layout="pfllib")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c1 = counts_of(labels, P.pathological(labels, 10, np.random.default_rng(3), 2, balance=True, layout="pfllib"))
    c2 = counts_of(labels, P.pathological(labels, 10, np.random.default_rng(4), 2, balance=True, layout="pfllib"))
    np.testing.assert_array_equal(c1, c2)


# --- PFLlib's failures become one clear error -------------------------------------------------------------------

@pytest.mark.parametrize("call,hint", [
    # 30 samples per class among 40 owners: n/s < 1, PFLlib's randint fails with "low >= high"
    (lambda y: P.iid(y, 40, np.random.default_rng(0), layout="pfllib"), "too small for PFLlib's unbalanced draw"),
    # balanced: 30 samples among 40 owners gives the first 39 nothing, so clients end up empty
    (lambda y: P.iid(y, 40, np.random.default_rng(0), balance=True, layout="pfllib"),
     "balanced split leaves a client with 0 samples"),
    (lambda y: P.pathological(y, 20, np.random.default_rng(0), 2, least_samples=14, layout="pfllib", max_tries=5),
     "no draw in 5 tries"),
    (lambda y: P.pathological(y, 4, np.random.default_rng(0), 2, layout="pfl"), "choose one of library, pfllib"),
])
def test_impossible_settings_raise_one_partition_error(call, hint):
    with pytest.raises(P.PartitionError, match=hint):
        call(labels_of([30] * 10))


# --- exdir's minimum client size ---------------------------------------------------------------------------------

def test_exdir_default_least_samples_is_pfllibs_ten():
    assert du.default_least_samples(0.75, 70000, 20, 0.5, "exdir") == 10
    assert du.default_least_samples(0.75, 70000, 20, 0.5, "dir") == 40
    assert du.default_least_samples(0.75, 70000, 20, 0.5) == 40
    assert du.default_least_samples(0.75, 300, 20, 0.5, "exdir") == 7  # capped at half the mean size, 7.5


def test_exdir_reaches_ten_samples_per_client():
    labels = labels_of([100] * 10)
    for seed in range(3):
        parts = P.extended_dirichlet(labels, 20, np.random.default_rng(seed), alpha=0.5, class_per_client=2,
                                     least_samples=10)
        assert min(len(p) for p in parts) >= 10
        assert_exact_cover(parts, len(labels))


# --- generator flag and config.json ---------------------------------------------------------------------------

@pytest.fixture
def gray_npz(tmp_path):
    """400 gray 28x28 images, 40 per class."""
    path = tmp_path / "gray.npz"
    np.savez(path, x=np.zeros((400, 28, 28), np.uint8), y=np.repeat(np.arange(10), 40).astype(np.int64))
    return path


def generate(tmp_path, source, *argv):
    """One split after another under one name: each replaces the last (--overwrite)."""
    generate_MNIST.main([*argv, "--source", str(source), "--root", str(tmp_path), "--overwrite"])
    return json.loads((tmp_path / "MNIST" / "config.json").read_text())


def test_generator_records_the_layout_and_follows_pfllibs_groups(tmp_path, gray_npz, capsys):
    config = generate(tmp_path, gray_npz, "noniid", "balance", "pat", "--num-clients", "10", "--layout", "pfllib")
    assert config["layout"] == "pfllib" and config["least_samples"] == 20
    # g = ceil(10*2/10) = 2: clients 2j and 2j+1 hold classes 2j and 2j+1, 20 samples of each
    expected = [[20 if c // 2 == i // 2 else 0 for c in range(10)] for i in range(10)]
    assert config["label_counts"] == expected
    capsys.readouterr()
    config = generate(tmp_path, gray_npz, "noniid", "balance", "pat", "--num-clients", "10")
    assert "skipping" not in capsys.readouterr().out  # a changed layout regenerates the split
    assert config["layout"] == "library"
    config = generate(tmp_path, gray_npz, "iid", "-", "-", "--num-clients", "4", "--layout", "pfllib")
    assert config["layout"] == "pfllib" and config["class_per_client"] == 10


def test_generator_exdir_default_and_explicit_least_samples(tmp_path, gray_npz):
    config = generate(tmp_path, gray_npz, "noniid", "-", "exdir", "--num-clients", "5", "--alpha", "1")
    assert config["least_samples"] == 10 and config["layout"] is None
    assert generate(tmp_path, gray_npz, "noniid", "-", "dir", "--num-clients", "5")["least_samples"] == 40
    explicit = generate(tmp_path, gray_npz, "noniid", "-", "exdir", "--num-clients", "5", "--alpha", "1",
                        "--least-samples", "25")
    assert explicit["least_samples"] == 25
    assert min(np.add(explicit["train_samples"], explicit["test_samples"])) >= 25


@pytest.mark.parametrize("scheme", ["dir", "exdir"])
def test_layout_flag_is_rejected_where_the_scheme_has_one_layout(scheme, capsys):
    parser = du.common_parser("test")
    with pytest.raises(SystemExit) as exit_info:
        du.resolve_partition(parser, parser.parse_args(["--partition", scheme, "--layout", "pfllib"]), 10, 2)
    assert exit_info.value.code == 2
    assert f"--layout is not used by the {scheme} partition" in capsys.readouterr().err
