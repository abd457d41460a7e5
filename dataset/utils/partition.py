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

Layouts of ``pat`` and ``iid`` (the generators' ``--layout`` flag):

- ``library`` (default) as above: random class sets with balanced owner counts,
  and unbalanced shares from weights uniform(0.1, 1), so no owner dominates.
  MNIST, 20 clients, unbalanced, mean over seeds 1-10: client-size CV 0.29
  (pat, k=2) and 0.15 (iid); the largest client holds 8 % and 6 %.
- ``pfllib`` PFLlib's ``separate_data`` structure, for comparing with numbers
  produced by PFLlib. Classes are handed out in label order to fixed groups of
  g = ceil(N k / C) clients: class c goes to the first g clients that still
  hold fewer than k classes, so clients 0..3 share classes {0, 1} for MNIST
  with 20 clients and k = 2. Within each class every owner but the last gets
  int(n/s) samples (balanced) or an integer drawn from
  [int(max(n/s/10, least_samples/C)), int(n/s)) (unbalanced), where n is the
  class size and s its owner count; the last owner gets the remainder, so
  one client per group collects every remainder. MNIST, 20 clients,
  unbalanced, seeds 1-10: CV 0.82 (pat, k=2; the last clients of the five
  groups hold 60 % of the data) and 1.97 (iid; the last client holds 48 %);
  PFLlib's loop with its own global random state gives 0.79 and 2.00. When
  g C exceeds N k, clients late in the order can hold fewer than k classes
  (20 clients, k = 3: clients 18 and 19 hold class 9 only), as in PFLlib.
  Where PFLlib goes wrong this layout stops with a ``PartitionError``
  instead: the groups use up all N k class slots before the last class
  (PFLlib drops the remaining classes' samples without a word), a class is
  too small for the unbalanced draw (PFLlib raises numpy's "low >= high"),
  or a client ends up below ``least_samples`` (PFLlib does not check, and
  balanced shares of a class smaller than its owner count leave clients
  empty); unbalanced draws are first retried as in the library layout,
  which PFLlib's settings on MNIST never need. The group size is computed
  in exact integer arithmetic (PFLlib's floating-point ceil adds one client
  for a few settings, e.g. 14 clients, 100 classes, k = 50). Samples within
  a class are dealt at random rather than in file order.

``dir`` and ``exdir`` have one layout, PFLlib's. The generators' default
``least_samples`` for ``exdir`` is 10, PFLlib's ``min_require_size``.

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


LAYOUTS = ("library", "pfllib")


def pfllib_class_groups(num_clients, num_classes, class_per_client, scheme="pat"):
    """Owners of each class under PFLlib's fixed rule; returns one sorted client array per class.

    Class positions 0..C-1 are handed out in order; class c goes to the first
    g = ceil(N k / C) clients that still hold fewer than k classes. Raises a
    PartitionError where PFLlib would run out of clients and drop classes.
    """
    group = -(-num_clients * class_per_client // num_classes)
    room = np.full(num_clients, class_per_client)
    owners = []
    for c in range(num_classes):
        own = np.flatnonzero(room > 0)[:group]
        if len(own) == 0:
            raise PartitionError(
                f"{scheme} (pfllib layout): groups of {group} clients per class use up all {num_clients} x "
                f"{class_per_client} class slots before class position {c}, so PFLlib would drop "
                f"{num_classes - c} of the {num_classes} classes; use --layout library or make num_clients x "
                f"class_per_client a multiple of {num_classes}")
        room[own] -= 1
        owners.append(own)
    return owners


def _pfllib_share_sizes(scheme, n, num_shares, balance, least_share, rng):
    """PFLlib's split of n samples among num_shares owners: every owner but the last gets a drawn
    (or equal) share and the last takes the remainder."""
    per = n / num_shares
    if balance:
        head = np.full(num_shares - 1, int(per), dtype=np.int64)
    else:
        low, high = int(max(per / 10, least_share)), int(per)
        if num_shares > 1 and low >= high:
            raise PartitionError(
                f"{scheme} (pfllib layout): a class of {n} samples is too small for PFLlib's unbalanced draw "
                f"among {num_shares} owners (share range [{low}, {high}) is empty); use --balance, fewer clients "
                f"or a smaller --least-samples")
        head = rng.integers(low, high, num_shares - 1) if num_shares > 1 else np.zeros(0, dtype=np.int64)
    return np.append(head, n - head.sum())


def _pfllib_owned_classes(scheme, by_class, num_clients, rng, class_per_client, balance, least_samples,
                          max_tries):
    """``pat``/``iid`` in PFLlib's layout: fixed class groups, remainder to each group's last client."""
    num_classes = len(by_class)
    owners = pfllib_class_groups(num_clients, num_classes, class_per_client, scheme)
    tries = 1 if balance else max_tries  # a balanced split has nothing random to redraw
    for _ in range(tries):
        counts = np.zeros((num_classes, num_clients), dtype=np.int64)
        for c, own in enumerate(owners):
            counts[c, own] = _pfllib_share_sizes(scheme, len(by_class[c]), len(own), balance,
                                                 least_samples / num_classes, rng)
        if counts.sum(axis=0).min() >= least_samples:
            return _deal(by_class, counts, rng)
    what = (f"the balanced split leaves a client with {counts.sum(axis=0).min()} samples" if balance
            else f"no draw in {tries} tries gave every client >= {least_samples} samples")
    raise PartitionError(f"{scheme} (pfllib layout): {what}, fewer than --least-samples {least_samples}; use fewer "
                         f"clients, a smaller --least-samples or --layout library")


def _owned_classes(scheme, labels, num_clients, rng, class_per_client, balance, least_samples, max_tries,
                   layout="library"):
    """Shared body of ``pat`` and ``iid``: split each class among its owners."""
    if layout not in LAYOUTS:
        raise PartitionError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
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
    if layout == "pfllib":
        return _pfllib_owned_classes(scheme, by_class, num_clients, rng, class_per_client, balance, least_samples,
                                     max_tries)
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


def pathological(labels, num_clients, rng, class_per_client=2, balance=False, least_samples=1, max_tries=1000,
                 layout="library"):
    """Pathological non-IID: each client holds ``class_per_client`` classes.

    Library layout: random classes, each owned by about num_clients * k /
    num_classes clients, its samples split among them in equal (``balance``)
    or random shares. ``layout="pfllib"``: PFLlib's fixed class groups and
    shares (module docstring).
    """
    return _owned_classes("pat", labels, num_clients, rng, class_per_client, balance, least_samples, max_tries,
                          layout)


def iid(labels, num_clients, rng, balance=False, least_samples=1, max_tries=1000, layout="library"):
    """IID: every client holds every class; balanced shares are stratified per class.

    ``layout="pfllib"`` gives every class's remainder to the last client, whose
    unbalanced share is then about half of the data (module docstring).
    """
    num_classes = len(np.unique(np.asarray(labels)))
    return _owned_classes("iid", labels, num_clients, rng, num_classes, balance, least_samples, max_tries, layout)


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
              least_samples=1, max_tries=1000, layout="library"):
    """Dispatch to the partitioner named ``scheme`` (one of ``SCHEMES``), passing only what it uses.

    ``layout`` (one of ``LAYOUTS``, None = library) applies to ``pat`` and ``iid``; ``dir`` and ``exdir``
    have one layout, PFLlib's.
    """
    layout = layout or "library"
    if scheme == "iid":
        return iid(labels, num_clients, rng, balance, least_samples, max_tries, layout)
    if scheme == "pat":
        return pathological(labels, num_clients, rng, class_per_client, balance, least_samples, max_tries, layout)
    if scheme == "dir":
        return dirichlet(labels, num_clients, rng, alpha, least_samples, max_tries)
    if scheme == "exdir":
        return extended_dirichlet(labels, num_clients, rng, alpha, class_per_client, least_samples, max_tries)
    raise PartitionError(f"unknown partition scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
