"""Invariants of the label partitioners in dataset/utils/partition.py."""

import numpy as np
import pytest

from dataset.utils import partition as P

NUM_CLASSES = 10


def make_labels(seed=0):
    """Ten classes of unequal size (150..249 samples), in shuffled order."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(150, 250, NUM_CLASSES)
    return rng.permutation(np.repeat(np.arange(NUM_CLASSES), sizes)).astype(np.int64)


def classes_of(labels, parts):
    return [set(np.unique(labels[p]).tolist()) for p in parts]


def assert_exact_cover(parts, n):
    """Every index 0..n-1 appears in exactly one client."""
    everything = np.concatenate(parts)
    assert everything.dtype == np.int64
    assert len(everything) == n
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))


SETTINGS = {
    "iid": dict(balance=False),
    "pat": dict(class_per_client=2, balance=False),
    "dir": dict(alpha=0.1),
    "exdir": dict(alpha=0.5, class_per_client=3),
}


@pytest.mark.parametrize("scheme", P.SCHEMES)
@pytest.mark.parametrize("num_clients", [1, 7, 20])
def test_every_sample_in_exactly_one_client(scheme, num_clients):
    labels = make_labels()
    if scheme in ("pat", "exdir") and num_clients * SETTINGS[scheme]["class_per_client"] < NUM_CLASSES:
        pytest.skip("too few clients to cover every class")
    parts = P.partition(labels, num_clients, np.random.default_rng(3), scheme, least_samples=5, **SETTINGS[scheme])
    assert len(parts) == num_clients
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 5


@pytest.mark.parametrize("scheme", ["iid", "pat"])
@pytest.mark.parametrize("balance", [False, True])
@pytest.mark.parametrize("num_clients", [1, 5, 10, 20])
def test_pfllib_layout_every_sample_in_exactly_one_client(scheme, balance, num_clients):
    labels = make_labels()
    if scheme == "pat" and num_clients * 2 < NUM_CLASSES:
        pytest.skip("too few clients to cover every class")
    parts = P.partition(labels, num_clients, np.random.default_rng(3), scheme, class_per_client=2, balance=balance,
                        least_samples=5, layout="pfllib")
    assert len(parts) == num_clients
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 5
    # dir and exdir have one layout: the flag changes nothing there
    for other in ("dir", "exdir"):
        a = P.partition(labels, 10, np.random.default_rng(3), other, class_per_client=2, layout="pfllib")
        b = P.partition(labels, 10, np.random.default_rng(3), other, class_per_client=2)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("num_clients,k", [(20, 2), (7, 3), (5, 2), (13, 4), (4, 10), (30, 1)])
def test_pat_exact_classes_and_balanced_owner_counts(num_clients, k):
    labels = make_labels()
    parts = P.pathological(labels, num_clients, np.random.default_rng(1), class_per_client=k)
    held = classes_of(labels, parts)
    assert all(len(h) == k for h in held)
    owners = np.bincount(np.concatenate([sorted(h) for h in held]), minlength=NUM_CLASSES)
    assert owners.sum() == num_clients * k
    assert owners.max() - owners.min() <= 1


def test_pat_class_choice_is_random_not_a_fixed_pattern():
    labels = make_labels()
    held = {seed: classes_of(labels, P.pathological(labels, 20, np.random.default_rng(seed), 2))
            for seed in range(5)}
    assert len({tuple(map(frozenset, h)) for h in held.values()}) == 5
    # PFLlib's fixed pattern gives clients 0-3 classes {0, 1}, and only 5 distinct pairs among 20 clients.
    assert not all(h[0] == {0, 1} for h in held.values())
    assert max(len({frozenset(c) for c in h}) for h in held.values()) > 5


def test_pat_balanced_gives_equal_shares_of_each_class():
    labels = make_labels()
    parts = P.pathological(labels, 20, np.random.default_rng(2), class_per_client=2, balance=True)
    for c in range(NUM_CLASSES):
        shares = [np.sum(labels[p] == c) for p in parts if np.any(labels[p] == c)]
        assert max(shares) - min(shares) <= 1
        assert sum(shares) == np.sum(labels == c)


def test_pat_unbalanced_shares_differ():
    labels = make_labels()
    parts = P.pathological(labels, 20, np.random.default_rng(2), class_per_client=2, balance=False)
    shares = [np.sum(labels[p] == 0) for p in parts if np.any(labels[p] == 0)]
    assert max(shares) - min(shares) > 1


def test_iid_balanced_is_stratified():
    labels = make_labels()
    parts = P.iid(labels, 8, np.random.default_rng(0), balance=True)
    counts = np.array([np.bincount(labels[p], minlength=NUM_CLASSES) for p in parts])
    assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels))


def test_iid_unbalanced_has_every_class_everywhere():
    labels = make_labels()
    parts = P.iid(labels, 8, np.random.default_rng(0), balance=False)
    assert all(len(h) == NUM_CLASSES for h in classes_of(labels, parts))
    assert len({len(p) for p in parts}) > 1


def test_dir_respects_least_samples_and_alpha_controls_skew():
    labels = make_labels()

    def mean_classes_held(alpha):
        parts = P.dirichlet(labels, 10, np.random.default_rng(4), alpha=alpha, least_samples=30)
        assert min(len(p) for p in parts) >= 30
        counts = np.array([np.bincount(labels[p], minlength=NUM_CLASSES) for p in parts])
        return np.mean((counts / counts.sum(axis=1, keepdims=True) > 0.05).sum(axis=1))

    assert mean_classes_held(0.1) < mean_classes_held(100.0)
    assert mean_classes_held(100.0) == NUM_CLASSES


class Proportions:
    """A stand-in generator whose Dirichlet draws are given in advance, one per class."""

    def __init__(self, *draws):
        self.draws = [np.asarray(d, dtype=float) for d in draws]

    def dirichlet(self, alpha):
        assert len(alpha) == len(self.draws[0])
        return self.draws.pop(0)


def test_dirichlet_counts_by_hand_with_the_client_size_cap():
    # 3 classes of 10 among 2 clients: the cap is 30 / 2 = 15 samples
    counts = P._dirichlet_counts([10, 10, 10], [np.arange(2)] * 3, 2, 0.1,
                                 Proportions([1.0, 0.0], [0.5, 0.5], [0.7, 0.3]))
    # class 0: 10 / 0; class 1 (client 0 at 10 < 15): 5 / 5; class 2: client 0 holds 15, so client 1 gets all 10
    np.testing.assert_array_equal(counts, [[10, 0], [5, 5], [0, 10]])
    # cuts floor the cumulative shares: 0.36 * 10 -> 3 (rounding would give 4), then 10 - 3
    np.testing.assert_array_equal(P._dirichlet_counts([10], [np.arange(2)], 2, 0.1, Proportions([0.36, 0.64])),
                                  [[3, 7]])


def test_dirichlet_counts_fall_back_to_the_unmasked_draw_when_every_owner_is_full():
    # class 1 has one owner, client 0, already over the cap (14 / 2 = 7): it still gets the whole class
    counts = P._dirichlet_counts([10, 4], [np.arange(2), np.array([0])], 2, 0.1, Proportions([1.0, 0.0], [1.0]))
    np.testing.assert_array_equal(counts, [[10, 0], [4, 0]])


def test_exdir_clients_hold_only_their_k_classes():
    labels = make_labels()
    for seed in range(3):
        parts = P.extended_dirichlet(labels, 20, np.random.default_rng(seed), alpha=0.5, class_per_client=2,
                                     least_samples=20)
        assert all(len(h) <= 2 for h in classes_of(labels, parts))
        assert min(len(p) for p in parts) >= 20
        assert_exact_cover(parts, len(labels))


def test_same_generator_seed_same_partition_different_seed_differs():
    labels = make_labels()
    for scheme in P.SCHEMES:
        a = P.partition(labels, 10, np.random.default_rng(7), scheme, **SETTINGS[scheme])
        b = P.partition(labels, 10, np.random.default_rng(7), scheme, **SETTINGS[scheme])
        c = P.partition(labels, 10, np.random.default_rng(8), scheme, **SETTINGS[scheme])
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("call,hint", [
    (lambda y, r: P.dirichlet(y, 20, r, alpha=0.001, least_samples=90, max_tries=50), "--alpha"),
    (lambda y, r: P.pathological(y, 4, r, class_per_client=2), "--class-per-client"),
    (lambda y, r: P.pathological(y, 20, r, class_per_client=11), "class_per_client=11"),
    (lambda y, r: P.extended_dirichlet(y, 3, r, class_per_client=3), "more clients"),
    (lambda y, r: P.iid(y, 100, r, least_samples=100), "fewer clients"),
    (lambda y, r: P.extended_dirichlet(y, 20, r, alpha=0.01, class_per_client=1, least_samples=95,
                                       max_tries=20), "--least-samples"),
    (lambda y, r: P.partition(y, 5, r, "zipf"), "iid, pat, dir, exdir"),
])
def test_impossible_settings_raise_partition_error(call, hint):
    with pytest.raises(P.PartitionError, match=hint.replace("-", r"\-")):
        call(make_labels(), np.random.default_rng(0))
    assert issubclass(P.PartitionError, ValueError)


@pytest.mark.parametrize("num_clients,num_classes,k", [(20, 10, 2), (3, 10, 4), (10, 10, 10), (1, 5, 5), (50, 7, 3)])
def test_assign_classes_keeps_degrees(num_clients, num_classes, k):
    held = P.assign_classes(num_clients, num_classes, k, np.random.default_rng(5))
    assert all(len(h) == k == len(set(h.tolist())) for h in held)
    owners = np.bincount(np.concatenate(held), minlength=num_classes)
    assert owners.max() - owners.min() <= 1


@pytest.mark.parametrize("n,ratio,train", [(100, 0.75, 75), (7, 0.75, 5), (9, 0.75, 7), (2, 0.75, 1), (2, 0.1, 1), (1, 0.75, 1),
                                           (0, 0.75, 0), (10, 0.99, 9)])
def test_split_train_test_sizes(n, ratio, train):
    idx = np.arange(1000, 1000 + n)
    tr, te = P.split_train_test(idx, ratio, np.random.default_rng(0))
    assert len(tr) == train and len(te) == n - train
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), idx)


def test_split_train_test_is_random():
    idx = np.arange(100)
    a, _ = P.split_train_test(idx, 0.5, np.random.default_rng(0))
    b, _ = P.split_train_test(idx, 0.5, np.random.default_rng(1))
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, idx[:50])
