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


# ---- boundaries and hand-computed pieces -------------------------------------------------------------
class Fixed:
    """A stand-in generator: the draws named in ``fixed`` come from the given lists (each call takes the
    next), their arguments are recorded in ``calls``; every other draw is a real generator's."""

    def __init__(self, seed=0, **fixed):
        self.fixed = {name: list(values) for name, values in fixed.items()}
        self.calls, self.rng = [], np.random.default_rng(seed)

    def __getattr__(self, name):
        if name in self.fixed:
            def draw(*args, **kwargs):
                self.calls.append((name, args, kwargs))
                return np.asarray(self.fixed[name].pop(0))
            return draw
        return getattr(self.rng, name)


@pytest.mark.parametrize("labels", [np.zeros((4, 2), dtype=np.int64), np.zeros(4, dtype=np.float32)])
def test_labels_must_be_one_dimensional_integers(labels):
    with pytest.raises(P.PartitionError, match="1-D integer array"):
        P.iid(labels, 2, np.random.default_rng(0))


@pytest.mark.parametrize("scheme", P.SCHEMES)
def test_client_count_and_size_checks_of_every_scheme(scheme):
    labels = np.repeat(np.arange(2), 6)  # 12 samples, 2 classes
    kw = dict(class_per_client=1) if scheme in ("pat", "exdir") else {}
    with pytest.raises(P.PartitionError, match="num_clients must be >= 1, got 0"):
        P.partition(labels, 0, np.random.default_rng(0), scheme, **kw)
    with pytest.raises(P.PartitionError, match="2 clients x 7 samples each exceeds the 12 samples"):
        P.partition(labels, 2, np.random.default_rng(0), scheme, least_samples=7, **kw)
    # exactly least_samples x num_clients = the samples is possible: 2 clients of 6
    parts = P.partition(labels, 2, np.random.default_rng(0), scheme, least_samples=6, balance=True, alpha=100.0, **kw)
    assert sorted(len(p) for p in parts) == [6, 6]


def test_share_sizes_by_hand():
    # balanced: int(linspace(0, 10, 4)) = 0, 3, 6, 10 -> 3, 3, 4
    np.testing.assert_array_equal(P._share_sizes(10, 3, True, None), [3, 3, 4])
    # unbalanced: weights 0.1, 0.3, 0.6 -> cumulative shares 1, 4 (of 10), the last takes the rest
    rng = Fixed(uniform=[[0.1, 0.3, 0.6]])
    np.testing.assert_array_equal(P._share_sizes(10, 3, False, rng), [1, 3, 6])
    assert rng.calls == [("uniform", (0.1, 1.0, 3), {})]  # weights from uniform(0.1, 1) (module docstring)


@pytest.mark.parametrize("num_clients,num_classes,k", [(8, 10, 3), (50, 7, 3), (6, 4, 3)])
def test_assign_classes_keeps_degrees_for_every_seed(num_clients, num_classes, k):
    for seed in range(30):  # owner counts differ by at most one, however the extra owners fall
        held = P.assign_classes(num_clients, num_classes, k, np.random.default_rng(seed))
        assert all(len(h) == k == len(set(h.tolist())) for h in held)
        owners = np.bincount(np.concatenate(held), minlength=num_classes)
        assert owners.sum() == num_clients * k and owners.max() - owners.min() <= 1


def test_pfllib_share_sizes_by_hand():
    # 270 samples among 3 owners: per = 90, draws from [int(max(90/10, 0.5)), 90) = [9, 90); the last the rest
    rng = Fixed(integers=[[20, 30]])
    np.testing.assert_array_equal(P._pfllib_share_sizes("pat", 270, 3, False, 0.5, rng), [20, 30, 220])
    assert rng.calls == [("integers", (9, 90, 2), {})]
    # least_share above per / 10 raises the lower end: [int(max(9, 12.5)), 90)
    rng = Fixed(integers=[[40, 50]])
    P._pfllib_share_sizes("pat", 270, 3, False, 12.5, rng)
    assert rng.calls[0][1] == (12, 90, 2)
    # one owner takes the whole class, whatever the range
    np.testing.assert_array_equal(P._pfllib_share_sizes("pat", 5, 1, False, 10.0, Fixed()), [5])
    # two owners with an empty range: refused
    with pytest.raises(P.PartitionError, match=r"share range \[10, 2\) is empty"):
        P._pfllib_share_sizes("pat", 5, 2, False, 10.0, Fixed())
    np.testing.assert_array_equal(P._pfllib_share_sizes("pat", 11, 3, True, 0.0, None), [3, 3, 5])


def test_least_samples_is_a_lower_bound_met_with_equality():
    # pfllib layout, balanced: two classes of 4 for two clients, one class each -> 4 and 4, least 4 is met
    labels = np.repeat(np.arange(2), 4)
    parts = P.pathological(labels, 2, np.random.default_rng(0), class_per_client=1, balance=True, least_samples=4,
                           layout="pfllib")
    assert sorted(len(p) for p in parts) == [4, 4]
    # library layout, balanced: classes of 15 and 15 for three clients, one class each: one class is split
    # 7 / 8 among two owners, so the smallest client holds 7 (met at 7, never at 8) although each class holds 15
    labels = np.repeat(np.arange(2), 15)
    parts = P.pathological(labels, 3, np.random.default_rng(0), class_per_client=1, balance=True, least_samples=7)
    assert sorted(len(p) for p in parts) == [7, 8, 15]
    with pytest.raises(P.PartitionError, match="no draw in 5 tries gave every client >= 8 samples"):
        P.pathological(labels, 3, np.random.default_rng(0), class_per_client=1, balance=True, least_samples=8,
                       max_tries=5)
    # dir: a draw whose smallest client holds exactly least_samples is accepted
    labels = np.repeat(np.arange(2), 10)
    rng = Fixed(dirichlet=[[0.3, 0.7], [0.3, 0.7]])
    parts = P.dirichlet(labels, 2, rng, alpha=0.5, least_samples=6)
    assert sorted(len(p) for p in parts) == [6, 14]


def test_class_per_client_bounds():
    labels = np.repeat(np.arange(3), 5)
    for k in (0, 4):
        for fn in (P.pathological, P.extended_dirichlet):
            with pytest.raises(P.PartitionError, match=f"class_per_client={k} must be between 1 and the 3 classes"):
                fn(labels, 3, np.random.default_rng(0), class_per_client=k)
    for k in (1, 3):  # both ends allowed: each client holds exactly its k classes
        parts = P.extended_dirichlet(labels, 3, np.random.default_rng(1), alpha=100.0, class_per_client=k)
        assert all(len(c) == k for c in classes_of(labels, parts))


def test_exdir_redraws_class_sets_until_every_class_has_enough_owners():
    # 10 clients x 3 classes over 4 classes: every class needs max(1, 30 // 4 // 2) = 3 owners
    labels = np.repeat(np.arange(4), 50)
    two = [[0, 1, 2]] * 8 + [[0, 1, 3]] * 2                       # class 3: 2 owners -> redrawn
    three = [[0, 1, 2]] * 7 + [[0, 1, 3], [0, 2, 3], [1, 2, 3]]   # class 3: exactly 3 owners -> taken
    rng = Fixed(seed=2, choice=two + three)
    parts = P.extended_dirichlet(labels, 10, rng, alpha=100.0, class_per_client=3)
    assert [sorted(c) for c in classes_of(labels, parts)] == three
    assert len(rng.fixed["choice"]) == 0
    assert rng.calls[0] == ("choice", (4, 3), {"replace": False})  # k distinct classes per client


def test_dirichlet_counts_renormalise_over_the_owners_below_the_cap():
    # 3 clients, classes of 30 and 10: the cap is 40 / 3; client 0 holds 30 after class 0, so class 1's draw
    # 0.5 / 0.3 / 0.2 is renormalised over clients 1 and 2: 0.6 / 0.4 -> 6 / 4
    counts = P._dirichlet_counts([30, 10], [np.arange(3)] * 2, 3, 0.1, Proportions([1.0, 0.0, 0.0], [0.5, 0.3, 0.2]))
    np.testing.assert_array_equal(counts, [[30, 0, 0], [0, 6, 4]])
    # every owner of a class at the cap: the unmasked draw splits it (cap 18 / 3 = 6; clients 0, 1 hold 6 each)
    counts = P._dirichlet_counts([12, 6], [np.arange(3), np.array([0, 1])], 3, 0.1,
                                 Proportions([0.5, 0.5, 0.0], [0.3, 0.7]))
    np.testing.assert_array_equal(counts, [[6, 6, 0], [1, 5, 0]])


def test_alpha_must_be_positive():
    for alpha in (0.0, -0.5):
        with pytest.raises(P.PartitionError, match=f"alpha must be > 0, got {alpha}"):
            P.dirichlet(np.repeat(np.arange(2), 5), 2, np.random.default_rng(0), alpha=alpha)


def test_split_train_test_keeps_one_training_sample():
    tr, te = P.split_train_test(np.arange(3), 0.1, np.random.default_rng(0))  # round(0.3) = 0 -> at least 1
    assert len(tr) == 1 and len(te) == 2


def test_public_defaults_are_the_documented_ones():
    """The module docstring's and the generators' defaults: Dir(0.1), two classes per client, unbalanced,
    at least one sample per client, 1,000 tries, the library layout."""
    import inspect
    documented = dict(alpha=0.1, class_per_client=2, balance=False, least_samples=1, max_tries=1000, layout="library")
    for fn in (P.partition, P.pathological, P.iid, P.dirichlet, P.extended_dirichlet):
        defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
        assert defaults == {k: documented[k] for k in defaults}, fn.__name__
        assert set(defaults) >= {"least_samples", "max_tries"}


@pytest.mark.parametrize("scheme,direct", [
    ("iid", lambda y, r: P.iid(y, 7, r, balance=False, least_samples=5)),
    ("pat", lambda y, r: P.pathological(y, 7, r, class_per_client=3, balance=False, least_samples=5)),
    ("dir", lambda y, r: P.dirichlet(y, 7, r, alpha=0.5, least_samples=5)),
    ("exdir", lambda y, r: P.extended_dirichlet(y, 7, r, alpha=0.5, class_per_client=3, least_samples=5)),
])
def test_partition_passes_each_setting_to_its_scheme(scheme, direct):
    labels = make_labels()
    via = P.partition(labels, 7, np.random.default_rng(3), scheme, alpha=0.5, class_per_client=3, least_samples=5)
    assert all(np.array_equal(a, b) for a, b in zip(via, direct(labels, np.random.default_rng(3))))
