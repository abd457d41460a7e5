"""Label-based partitioners: split sample indices among federated clients.

Every partitioner takes a 1-D integer label array, the number of clients and a
``numpy.random.Generator`` (the only source of randomness), and returns one sorted
int64 index array per client. Every index appears in exactly one client.

Schemes (names as used by the generators' ``--partition`` flag):

- ``pat``   pathological: each client holds exactly ``class_per_client`` classes
  (McMahan et al. 2017, PFLlib's "pat"); the classes are drawn at random with
  every class owned by as equal a number of clients as possible.
- ``iid``   every client holds every class (``pat`` with k = number of classes).
- ``dir``   per class, client proportions ~ Dir(alpha) (Hsu et al. 2019; the
  "practical" setting of PFLlib and FedML).
- ``exdir`` extended Dirichlet (Li et al. 2023, arXiv:2311.03154): each client
  first draws ``class_per_client`` classes, then each class is split by a
  Dirichlet over only the clients that drew it.

Random draws are retried a bounded number of times (``max_tries``) until every
client holds at least ``least_samples`` samples; then a ``PartitionError`` says
which parameter to change. Nothing loops forever.
"""

import numpy as np


class PartitionError(ValueError):
    """A partition cannot be made with the requested parameters."""


def _class_indices(labels):
    """Return the sorted distinct labels and, for each, the indices holding it."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    classes = np.unique(labels)
    return classes, [np.flatnonzero(labels == c) for c in classes]


def _check_sizes(scheme, num_samples, num_clients, least_samples):
    """Reject settings where the client count alone makes the partition impossible."""
    if num_clients < 1:
        raise PartitionError(f"{scheme}: num_clients must be >= 1, got {num_clients}")
    if least_samples * num_clients > num_samples:
        raise PartitionError(
            f"{scheme}: {num_clients} clients x {least_samples} samples each exceeds the {num_samples} "
            f"samples; use fewer clients or a smaller --least-samples")


def _deal(by_class, counts, rng):
    """Shuffle each class's indices and hand out ``counts[class, client]`` of them.

    Partitioners first decide only how many samples of each class every client
    gets (cheap to redraw); the indices are drawn once the counts are accepted.
    Returns one sorted int64 index array per client.
    """
    parts = [[] for _ in range(counts.shape[1])]
    for idx, row in zip(by_class, counts):
        for client, piece in enumerate(np.split(rng.permutation(idx), np.cumsum(row)[:-1])):
            parts[client].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def _share_sizes(n, num_shares, balance, rng):
    """Sizes of ``num_shares`` pieces of ``n`` items.

    Balanced pieces differ by at most one; unbalanced pieces follow random
    weights from uniform(0.1, 1), so no owner's share is vanishingly small.
    """
    if balance:
        return np.diff(np.linspace(0, n, num_shares + 1).astype(int))
    weights = rng.uniform(0.1, 1.0, num_shares)
    return np.diff(np.concatenate([[0], (np.cumsum(weights) / weights.sum() * n).astype(int)[:-1], [n]]))


def assign_classes(num_clients, num_classes, class_per_client, rng):
    """Give each client ``class_per_client`` distinct classes, chosen at random.

    Class c gets ``d_c`` owners, with the d_c as equal as possible (they differ by
    at most one, and the classes getting one extra are random). A valid assignment
    is built by dealing class slots round-robin (each class's slots are
    contiguous and d_c <= num_clients, so no client gets a class twice) and is then
    randomised by swaps that keep every degree: two clients exchange one class
    each that the other lacks. Returns a list of sorted class-position arrays.
    """
    total = num_clients * class_per_client
    owners = np.full(num_classes, total // num_classes)
    owners[rng.choice(num_classes, total % num_classes, replace=False)] += 1
    order = rng.permutation(num_classes)
    slots = np.repeat(order, owners[order])
    held = [set(slots[i::num_clients].tolist()) for i in range(num_clients)]
    if class_per_client < num_classes and num_clients > 1:
        for _ in range(10 * total):  # ten swap attempts per slot mix the round-robin structure away
            a, b = rng.choice(num_clients, 2, replace=False)
            only_a, only_b = sorted(held[a] - held[b]), sorted(held[b] - held[a])
            if only_a:  # equal set sizes, so only_b is non-empty too
                ca, cb = only_a[rng.integers(len(only_a))], only_b[rng.integers(len(only_b))]
                held[a] = (held[a] - {ca}) | {cb}
                held[b] = (held[b] - {cb}) | {ca}
    return [np.array(sorted(h), dtype=np.int64) for h in held]


def _owned_classes(scheme, labels, num_clients, rng, class_per_client, balance, least_samples, max_tries):
    """Shared body of ``pat`` and ``iid``: split each class among its owners."""
    classes, by_class = _class_indices(labels)
    num_classes = len(classes)
    _check_sizes(scheme, len(labels), num_clients, least_samples)
    if not 1 <= class_per_client <= num_classes:
        raise PartitionError(
            f"{scheme}: class_per_client={class_per_client} must be between 1 and the {num_classes} classes present")
    if num_clients * class_per_client < num_classes:
        raise PartitionError(
            f"{scheme}: {num_clients} clients x {class_per_client} classes each leave some of the {num_classes} "
            f"classes without an owner; use more clients or a larger --class-per-client")
    sizes = np.array([len(idx) for idx in by_class])
    for _ in range(max_tries):
        counts = np.zeros((num_classes, num_clients), dtype=np.int64)
        for client, cls in enumerate(assign_classes(num_clients, num_classes, class_per_client, rng)):
            counts[cls, client] = 1
        for c in range(num_classes):
            own = np.flatnonzero(counts[c])
            counts[c, own] = _share_sizes(sizes[c], len(own), balance, rng)
        if counts.sum(axis=0).min() >= least_samples:
            return _deal(by_class, counts, rng)
    raise PartitionError(
        f"{scheme}: no draw in {max_tries} tries gave every client >= {least_samples} samples; "
        f"use fewer clients, --balance, a larger --class-per-client or a smaller --least-samples")


def pathological(labels, num_clients, rng, class_per_client=2, balance=False, least_samples=1, max_tries=1000):
    """Pathological non-IID: each client holds exactly ``class_per_client`` random classes.

    Each class is owned by about num_clients * k / num_classes clients and its
    samples are split among them in equal (``balance``) or random shares.
    """
    return _owned_classes("pat", labels, num_clients, rng, class_per_client, balance, least_samples, max_tries)


def iid(labels, num_clients, rng, balance=False, least_samples=1, max_tries=1000):
    """IID: every client holds every class; balanced shares are stratified per class."""
    num_classes = len(np.unique(np.asarray(labels)))
    return _owned_classes("iid", labels, num_clients, rng, num_classes, balance, least_samples, max_tries)


def _dirichlet_counts(class_sizes, owners, num_clients, alpha, rng):
    """Per-class sample counts for each client from Dir(alpha) over the class's owners.

    As in the FedML/PFLlib "practical" partitioner, classes are handed out in
    order and clients that already hold at least total/num_clients samples get
    proportion zero, which keeps client sizes from running away. When that mask
    would leave a class with no recipient at all, the class is split by the
    unmasked proportions instead. Returns a [num_classes, num_clients] array.
    """
    cap = sum(class_sizes) / num_clients
    counts = np.zeros((len(class_sizes), num_clients), dtype=np.int64)
    for c, (n, own) in enumerate(zip(class_sizes, owners)):
        own = np.asarray(own)
        proportions = rng.dirichlet(np.full(len(own), alpha))
        masked = proportions * (counts[:, own].sum(axis=0) < cap)
        if masked.sum() > 0:
            proportions = masked / masked.sum()
        cuts = np.concatenate([[0], (np.cumsum(proportions) * n).astype(int)[:-1], [n]])
        counts[c, own] = np.diff(cuts)
    return counts


def _retry_dirichlet(scheme, by_class, owners, num_clients, alpha, rng, least_samples, max_tries):
    """Redraw the Dirichlet counts until every client has ``least_samples`` (bounded)."""
    if alpha <= 0:
        raise PartitionError(f"{scheme}: alpha must be > 0, got {alpha}")
    class_sizes = [len(idx) for idx in by_class]
    for _ in range(max_tries):
        counts = _dirichlet_counts(class_sizes, owners, num_clients, alpha, rng)
        if counts.sum(axis=0).min() >= least_samples:
            return _deal(by_class, counts, rng)
    raise PartitionError(
        f"{scheme}: no Dirichlet draw in {max_tries} tries gave every client >= {least_samples} samples; "
        f"use a larger --alpha, fewer clients or a smaller --least-samples")


def dirichlet(labels, num_clients, rng, alpha=0.1, least_samples=1, max_tries=1000):
    """Dirichlet non-IID: each class is split among all clients by Dir(alpha) proportions."""
    classes, by_class = _class_indices(labels)
    _check_sizes("dir", len(labels), num_clients, least_samples)
    owners = [np.arange(num_clients)] * len(classes)
    return _retry_dirichlet("dir", by_class, owners, num_clients, alpha, rng, least_samples, max_tries)


def extended_dirichlet(labels, num_clients, rng, alpha=0.1, class_per_client=2, least_samples=1, max_tries=1000):
    """Extended Dirichlet (Li et al. 2023): k random classes per client, then Dir(alpha) per class.

    Level 1 redraws the class sets until every class has at least
    max(1, num_clients * k // num_classes // 2) owners; level 2 redraws the
    Dirichlet split over each class's owners until every client has
    ``least_samples``. A client therefore only ever holds its own k classes.
    """
    classes, by_class = _class_indices(labels)
    num_classes = len(classes)
    k = class_per_client
    _check_sizes("exdir", len(labels), num_clients, least_samples)
    if not 1 <= k <= num_classes:
        raise PartitionError(f"exdir: class_per_client={k} must be between 1 and the {num_classes} classes present")
    if num_clients * k < num_classes:
        raise PartitionError(
            f"exdir: {num_clients} clients x {k} classes each leave some of the {num_classes} classes without "
            f"an owner; use more clients or a larger --class-per-client")
    need = max(1, num_clients * k // num_classes // 2)
    for _ in range(max_tries):
        held = [rng.choice(num_classes, k, replace=False) for _ in range(num_clients)]
        if np.bincount(np.concatenate(held), minlength=num_classes).min() >= need:
            break
    else:
        raise PartitionError(
            f"exdir: no class draw in {max_tries} tries gave every class >= {need} owners; "
            f"use more clients or a larger --class-per-client")
    owners = [[i for i, h in enumerate(held) if c in h] for c in range(num_classes)]
    return _retry_dirichlet("exdir", by_class, owners, num_clients, alpha, rng, least_samples, max_tries)


def split_train_test(indices, train_ratio, rng):
    """Randomly split one client's indices into sorted (train, test) arrays.

    Train gets round(train_ratio * n) samples, clipped so that a client with at
    least two samples keeps at least one for training and one for testing.
    """
    indices = np.asarray(indices, dtype=np.int64)
    n = len(indices)
    n_train = int(round(train_ratio * n))
    if n >= 2:
        n_train = min(max(n_train, 1), n - 1)
    shuffled = rng.permutation(indices)
    return np.sort(shuffled[:n_train]), np.sort(shuffled[n_train:])


SCHEMES = ("iid", "pat", "dir", "exdir")


def partition(labels, num_clients, rng, scheme, alpha=0.1, class_per_client=2, balance=False,
              least_samples=1, max_tries=1000):
    """Dispatch to the partitioner named ``scheme`` (one of ``SCHEMES``), passing only what it uses."""
    if scheme == "iid":
        return iid(labels, num_clients, rng, balance, least_samples, max_tries)
    if scheme == "pat":
        return pathological(labels, num_clients, rng, class_per_client, balance, least_samples, max_tries)
    if scheme == "dir":
        return dirichlet(labels, num_clients, rng, alpha, least_samples, max_tries)
    if scheme == "exdir":
        return extended_dirichlet(labels, num_clients, rng, alpha, class_per_client, least_samples, max_tries)
    raise PartitionError(f"unknown partition scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
