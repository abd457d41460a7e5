"""Shared machinery of the ``generate_<Name>.py`` scripts.

A generator loads one labelled dataset (a local ``--source`` npz, a torchvision
download or bundled data), merges its train and test parts, partitions the
samples among clients (``dataset.utils.partition``), splits every client into
train and test, and writes::

    <root>/<out>/train/<i>.npz   x (uint8 [n, C, H, W] or float32 [n, D]), y (int64 [n])
    <root>/<out>/test/<i>.npz    same layout
    <root>/<out>/config.json     every generation parameter, checksum and per-client stats

``config.json`` is written last, so a split without it is incomplete. A rerun
with identical parameters (and the same source checksum) is skipped; one with
other parameters under the same name is refused unless ``--overwrite``.

User errors end with one line on stderr and exit code 2 (``run_cli``).
"""

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dataset.utils.partition import LAYOUTS, SCHEMES, PartitionError, partition, split_train_test
from utils import fileio  # system/utils/fileio.py, the library's I/O layer (docs/architecture.md, "Finding the code")

FORMAT_VERSION = 1
EXDIR_LEAST_SAMPLES = 10  # PFLlib's exdir minimum client size (its min_require_size)
# Where splits go without --root: dataset/ itself, or PFL_DATASET_ROOT (the same default the runs read from).
DATASET_ROOT = Path(os.environ.get("PFL_DATASET_ROOT") or Path(__file__).resolve().parents[1])
DERIVED_KEYS = ("train_samples", "test_samples", "label_counts")


class DatasetError(Exception):
    """A user-facing problem (bad source file, offline download, impossible setting)."""


@dataclass(frozen=True)
class ImageSpec:
    """What a generator knows about its image dataset.

    ``least_share`` caps the default least_samples at this fraction of the mean
    client size (PFLlib uses one half).
    """
    name: str
    num_classes: int
    image_shape: tuple
    default_class_per_client: int = 2
    torchvision_class: str | None = None
    class_names: tuple | None = None
    least_share: float = 0.5


def run_cli(main, argv=None):
    """Call ``main(argv)``; turn a DatasetError or PartitionError into one line and exit code 2."""
    try:
        return main(argv)
    except (DatasetError, PartitionError, fileio.FileIOError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


# Zip bombs: an archive whose members add up to more than this many times its own size is refused (image
# and text archives unpack to 1-20 times theirs). check_common sets it from --max-unpack-ratio.
MAX_UNPACK_RATIO = 200.0
UNPACK_LIMIT = {"ratio": MAX_UNPACK_RATIO}


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr (exit code 2), not the usage text."""

    def error(self, message):
        self.exit(2, f"error: {message} (-h lists the flags)\n")


def common_parser(description, with_partition=True, with_source=True,
                  least_rule="int(min(10/(1-train_ratio), mean client size * 0.5))", num_clients=20,
                  source_help="local npz with arrays x, y (optional is_test) instead of downloading"):
    """Flags shared by all generators; with_partition adds PFLlib's positional form and the scheme flags.

    Positional form (PFLlib): ``[noniid|iid] [balance|-] [pat|dir|exdir|-]``.
    Named flags override it. Defaults are resolved later (``resolve_partition``)
    because some depend on the dataset; least_rule documents the least-samples default.
    """
    parser = OneLineParser(description=description)
    if with_partition:
        parser.add_argument("niid", nargs="?", choices=["noniid", "iid"], help="PFLlib form: noniid or iid")
        parser.add_argument("balance_pos", nargs="?", choices=["balance", "-"], metavar="balance",
                            help="PFLlib form: 'balance' for equal shares, '-' for random shares")
        parser.add_argument("partition_pos", nargs="?", choices=["pat", "dir", "exdir", "-"], metavar="partition",
                            help="PFLlib form: pat, dir, exdir, or '-' (= pat)")
        parser.add_argument("--partition", choices=SCHEMES, help="partition scheme (default pat)")
        parser.add_argument("--alpha", type=float, help="Dirichlet concentration for dir/exdir (default 0.1)")
        parser.add_argument("--class-per-client", type=int,
                            help="classes per client for pat/exdir (default 2; 10 for CIFAR-100)")
        parser.add_argument("--balance", action=argparse.BooleanOptionalAction, default=None,
                            help="equal (--balance) or random (--no-balance, default) class shares for pat/iid")
        parser.add_argument("--layout", choices=LAYOUTS,
                            help="pat/iid structure (default library): 'library' draws each client's classes at "
                                 "random and unbalanced shares from weights uniform(0.1, 1) (MNIST, 20 clients, "
                                 "unbalanced, mean of seeds 1-10: client-size CV 0.29 pat, 0.15 iid); 'pfllib' follows PFLlib: classes "
                                 "in label order to fixed groups of ceil(N*k/C) clients (20 clients, k=2: clients 0-3 "
                                 "share classes 0 and 1), unbalanced shares randint(n/s/10, n/s) with each class's "
                                 "remainder to its group's last client (CV 0.82 pat, 1.97 iid; in iid one client "
                                 "holds 48%% of the data); dir and exdir already follow PFLlib")
    default_clients = num_clients if num_clients is not None else "the data's natural clients"
    parser.add_argument("--num-clients", type=int, default=num_clients,
                        help=f"number of clients (default {default_clients})")
    parser.add_argument("--train-ratio", type=float, default=0.75, help="train share of each client (default 0.75)")
    parser.add_argument("--least-samples", type=int, help=f"minimum samples per client (default {least_rule})")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random draw (default 1)")
    parser.add_argument("--out", help="output folder name under the root (default: the dataset name)")
    if with_source:
        parser.add_argument("--source", help=source_help)
        parser.add_argument("--subsample", type=int, default=None,
                            help="keep only this many samples, drawn per class in proportion (from --seed) "
                                 "before partitioning; for small-scale experiments (default: all)")
    parser.add_argument("--root", help="folder that holds the split folders (default: the dataset/ folder)")
    parser.add_argument("--plot", action="store_true", help="save label_distribution.png next to the split")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a split of that name made with other parameters (default: refuse)")
    parser.add_argument("--max-unpack-ratio", type=float, default=MAX_UNPACK_RATIO,
                        help="refuse an archive that would unpack to more than this many times its own size "
                             f"(a zip bomb; default {MAX_UNPACK_RATIO:g})")
    return parser


def resolve_partition(parser, args, num_classes, default_class_per_client):
    """Merge positional and named partition flags into the effective scheme parameters.

    Returns a dict with partition, alpha, class_per_client, balance and layout.
    A parameter the scheme does not use is None (null in config.json); naming
    it as a flag is an error rather than being silently ignored (``--layout``
    with dir/exdir too: they have one layout, PFLlib's).
    """
    if args.partition:
        scheme = args.partition
    elif args.niid == "iid":
        scheme = "iid"
    else:
        scheme = args.partition_pos if args.partition_pos not in (None, "-") else "pat"
    users = {"--alpha": (args.alpha, ("dir", "exdir")), "--class-per-client": (args.class_per_client, ("pat", "exdir")),
             "--balance/--no-balance": (args.balance, ("pat", "iid")), "--layout": (args.layout, ("pat", "iid"))}
    for flag, (value, schemes) in users.items():
        if value is not None and scheme not in schemes:
            hint = "; dir and exdir have one layout, PFLlib's" if flag == "--layout" else ""
            parser.error(f"{flag} is not used by the {scheme} partition (only by {' and '.join(schemes)}){hint}")
    balance = args.balance if args.balance is not None else args.balance_pos == "balance"
    alpha = 0.1 if args.alpha is None else args.alpha
    k = default_class_per_client if args.class_per_client is None else args.class_per_client
    if scheme in ("dir", "exdir") and not alpha > 0:
        parser.error(f"--alpha must be > 0, got {alpha}")
    if scheme in ("pat", "exdir") and not 1 <= k <= num_classes:
        parser.error(f"--class-per-client must be between 1 and {num_classes}, got {k}")
    return {
        "partition": scheme,
        "alpha": alpha if scheme in ("dir", "exdir") else None,
        "class_per_client": {"pat": k, "exdir": k, "iid": num_classes}.get(scheme),
        "balance": balance if scheme in ("pat", "iid") else None,
        "layout": (args.layout or "library") if scheme in ("pat", "iid") else None,
    }


def check_common(parser, args):
    """Reject out-of-range common flags with a one-line error; set the archive cap (``--max-unpack-ratio``)."""
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.out is not None and (Path(args.out).name != args.out or args.out in ("", ".", "..")):
        parser.error(f"--out is a folder name under --root (no / or ..), got {args.out!r}")
    if not args.max_unpack_ratio > 0:
        parser.error(f"--max-unpack-ratio must be > 0, got {args.max_unpack_ratio}")
    UNPACK_LIMIT["ratio"] = args.max_unpack_ratio
    if args.num_clients is not None and args.num_clients < 1:
        parser.error(f"--num-clients must be >= 1, got {args.num_clients}")
    if not 0 < args.train_ratio < 1:
        parser.error(f"--train-ratio must be between 0 and 1, got {args.train_ratio}")
    if args.least_samples is not None and args.least_samples < 1:
        parser.error(f"--least-samples must be >= 1, got {args.least_samples}")


def default_least_samples(train_ratio, num_samples, num_clients, share=0.5, scheme=None):
    """PFLlib's rules, capped at a share of the mean client size.

    exdir: 10 samples (PFLlib's exdir minimum); every other scheme: enough for
    ~10 test samples, 10 / (1 - train_ratio) (40 at the default 75/25 split).
    """
    target = EXDIR_LEAST_SAMPLES if scheme == "exdir" else 10 / (1 - train_ratio)
    least = int(min(target, num_samples / num_clients * share))
    if least < 2:
        raise DatasetError(f"{num_clients} clients are too many for {num_samples} samples "
                           f"(fewer than 2 per client); use fewer clients")
    return least


def arrays_sha256(*arrays):
    """Checksum of arrays' dtype, shape and bytes (for sources that are not one file)."""
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def file_sha256(path):
    """Checksum of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with fileio.open_read(path, "--source", cap=fileio.NPZ_CAP << 4) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_source_npz(path):
    """Load arrays x and y from a local npz without unpickling; returns (x, y, sha256).

    Any extra key (such as ``is_test``) is ignored: train and test are merged
    and re-split per client, as PFLlib does.
    """
    path = Path(path)
    try:  # a regular file; its headers checked before an array is read (system/utils/fileio.py)
        names = fileio.npz_names(path, "--source")
        missing = [k for k in ("x", "y") if k not in names]
        if missing:
            raise DatasetError(f"--source {path.name} lacks array(s) {', '.join(missing)}; it needs x (samples) "
                               f"and y (integer labels), found {', '.join(names)}")
        try:
            arrays = fileio.read_npz(path, ("x", "y"), "--source", ratio=UNPACK_LIMIT["ratio"])
        except fileio.FileIOError as err:
            raise DatasetError(f"--source {path.name} is not a plain-array npz ({err})") from None
    except fileio.FileIOError as err:  # not a file, not a zip (its directory is read in the I/O layer)
        raise DatasetError(str(err)) from None
    x, y = arrays["x"], arrays["y"]
    if x.ndim < 1 or not np.issubdtype(y.dtype, np.integer) or y.ndim != 1 or len(y) != len(x):  # x: one row per sample
        raise DatasetError(f"--source {path.name}: y must be integer labels with one per row of x, "
                           f"got {y.dtype} {y.shape} for x {x.shape}")
    return x, y.astype(np.int64), file_sha256(path)


def to_uint8_nchw(x, image_shape):
    """Images as uint8 [N, C, H, W]: add the channel axis to gray [N, H, W], move HWC channels first."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise DatasetError(f"images must be uint8 pixels 0..255, got {x.dtype}")
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if tuple(x.shape[1:]) != tuple(image_shape):
        raise DatasetError(f"expected images of shape {list(image_shape)} (C, H, W), got {list(x.shape[1:])}")
    return np.ascontiguousarray(x)


def download_torchvision(class_name, raw_dir, name):
    """Download train and test with torchvision and merge them; returns (x, y, class_names)."""
    from torchvision import datasets

    dataset_class = getattr(datasets, class_name)
    # the outermost folder this download creates (None when raw_dir exists), removed again if it fails
    made = fileio.outermost_missing(Path(raw_dir))
    try:  # torchvision writes here: a folder this module made and checked (no symlink on the way in the split)
        split_folder(Path(raw_dir).parent).sub(Path(raw_dir).name, what="download folder")
    except fileio.FileIOError as e:
        raise DatasetError(str(e)) from None
    try:
        parts = [dataset_class(root=str(raw_dir), train=train, download=True) for train in (True, False)]
    except (OSError, RuntimeError):
        if made is not None:  # only a folder the I/O layer made and recorded here, still the same folder
            fileio.remove_made(made)
        raise DatasetError(f"could not download {name} (offline?); make {name}'s arrays into an npz once on a "
                           f"machine that has them and pass --source FILE.npz (x: uint8 images, y: integer "
                           f"labels; the README's 'Generating client splits' says how)") from None
    x = np.concatenate([np.asarray(p.data) for p in parts])
    y = np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
    return x, y, tuple(parts[0].classes)


def generation_params(config):
    """The part of a config that determines the split: everything except the per-client stats."""
    return {k: v for k, v in config.items() if k not in DERIVED_KEYS}


def split_folder(out_dir):
    """The split's folder as a ``fileio.Folder``: ``--root`` (made where missing) opened once, ``--out``
    inside it a real folder (a symlink there is refused, never followed)."""
    out_dir = Path(out_dir)
    try:
        return fileio.Folder(out_dir.parent, what="--root").sub(out_dir.name, what="--out")
    except fileio.FileIOError as e:
        raise DatasetError(str(e)) from None


def read_split_config(out_dir):
    """The config.json of the split at out_dir, or None when there is none (or it cannot be read: not a
    regular file, not JSON, nested too deeply)."""
    try:
        return fileio.read_json(Path(out_dir) / "config.json", "config.json", follow=False)
    except fileio.FileIOError:
        return None


def split_is_current(out_dir, old, config):
    """True when out_dir holds a complete split whose config ``old`` has exactly these parameters."""
    if old is None or generation_params(old) != generation_params(config):
        return False
    return all((out_dir / part / f"{i}.npz").is_file()
               for part in ("train", "test") for i in range(config["num_clients"]))


def _clear_split(folder, old):
    """Remove an old split: config.json first (marks it incomplete), then the client files its config
    records (``train/<i>.npz``, ``test/<i>.npz`` for each of its ``num_clients``), never by glob; the
    ``train`` and ``test`` folders are reached without following a symlink."""
    folder.remove("config.json")
    n = old.get("num_clients") if isinstance(old, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= 10 ** 6:
        return
    for part in ("train", "test"):
        if folder.entry(part) is None:
            continue
        sub = folder.sub(part, create=False, what=f"--out {folder.path.name}")
        for i in range(n):
            sub.remove(f"{i}.npz")


def save_split(out_dir, x, y, train_idx, test_idx, config, folder=None, old=None):
    """Write every client's train/test npz, then config.json with the per-client stats, each through a
    temporary file renamed into place inside the split's folder (``fileio.Folder.replace``)."""
    folder = folder or split_folder(out_dir)
    try:
        _clear_split(folder, old)
        for part, idx_lists in (("train", train_idx), ("test", test_idx)):
            sub = folder.sub(part, what=f"--out {folder.path.name}")
            for i, idx in enumerate(idx_lists):
                sub.replace([(f"{i}.npz", lambda f, idx=idx: np.savez(f, x=x[idx], y=y[idx]))])
        num_classes = config["num_classes"]
        config = dict(config,
                      train_samples=[len(i) for i in train_idx],
                      test_samples=[len(i) for i in test_idx],
                      label_counts=[np.bincount(y[np.concatenate([a, b])], minlength=num_classes).tolist()
                                    for a, b in zip(train_idx, test_idx)])
        text = ("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in config.items()) + "\n}\n").encode()
        folder.replace([("config.json", lambda f: f.write(text))])
    except fileio.FileIOError as e:
        raise DatasetError(str(e)) from None
    return config


def format_summary(config):
    """Per-client table (train n, test n, count per label) and a total line."""
    counts = np.array(config["label_counts"])
    wide = counts.shape[1] > 20
    head = "client  train   test  " + ("label:count" if wide else " ".join(f"{c:>5}" for c in range(counts.shape[1])))
    lines = [head]
    for i, (n_tr, n_te, row) in enumerate(zip(config["train_samples"], config["test_samples"], counts)):
        cells = (" ".join(f"{c}:{n}" for c, n in enumerate(row) if n) if wide
                 else " ".join(f"{n:>5}" for n in row))
        lines.append(f"{i:>6} {n_tr:>6} {n_te:>6}  {cells}")
    sizes = counts.sum(axis=1)
    lines.append(f"total: {len(sizes)} clients, {sizes.sum()} samples (train {sum(config['train_samples'])}, "
                 f"test {sum(config['test_samples'])}); client size min {sizes.min()} max {sizes.max()}")
    return "\n".join(lines)


def plot_label_distribution(config, path, folder=None):
    """Bubble chart of per-client label counts (area proportional to count), written into the split's
    folder (a symlink at ``path`` is replaced, never followed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.array(config["label_counts"])
    clients, labels = np.nonzero(counts)
    fig = Figure(figsize=(max(6, 0.35 * counts.shape[0]), max(4, 0.3 * counts.shape[1])))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.scatter(clients, labels, s=counts[clients, labels] / counts.max() * 300, alpha=0.6)
    ax.set_xlabel("client")
    ax.set_ylabel("label")
    ax.set_title(f"{config['dataset']}: {config['partition']} partition, {counts.shape[0]} clients")
    fig.tight_layout()
    path = Path(path)
    try:
        (folder or split_folder(path.parent)).replace([(path.name, lambda f: fig.savefig(f, dpi=100, format="png"))])
    except fileio.FileIOError as e:
        raise DatasetError(str(e)) from None


def np_generators(seed):
    """Independent generators for the partition and the train/test split, both from one seed."""
    part_seq, split_seq = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(part_seq), np.random.default_rng(split_seq)


def other_split_params(old, config):
    """The generation parameters in which a split's config ``old`` differs from ``config``, as
    "name: on disk -> asked" strings; empty when there is no split (None) or it has the same parameters."""
    if old is None:
        return []
    old, new = generation_params(old), generation_params(config)
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def write_or_skip(out_dir, config, make_split, plot, overwrite=False):
    """Skip when the split on disk matches ``config``; else call make_split() -> (x, y, train, test) and save.
    A split of that name made with other parameters is not replaced unless ``overwrite`` (runs made on it
    would otherwise be compared with runs on the new one under one name): a DatasetError names the
    differences.

    Prints the per-client summary either way; returns the final config.
    """
    folder = split_folder(out_dir)
    old = read_split_config(out_dir)
    changed = other_split_params(old, config)
    if changed and not overwrite:
        raise DatasetError(f"split {out_dir.name} already exists with other parameters ({'; '.join(changed)}); "
                           f"give --out another name, or --overwrite to replace it")
    if split_is_current(out_dir, old, config):
        print(f"split {out_dir.name} already exists with the same parameters; skipping")
        config = old
    else:
        x, y, train_idx, test_idx = make_split()
        config = save_split(out_dir, x, y, train_idx, test_idx, config, folder, old)
        print(f"wrote {len(train_idx)} clients to {out_dir}")
    print(format_summary(config))
    if plot:
        plot_label_distribution(config, out_dir / "label_distribution.png", folder)
    return config


def load_images(spec, source, raw_dir, load_default):
    """Images and labels from --source or load_default(raw_dir), checked against the spec.

    Returns (x uint8 [N, C, H, W], y int64 [N], source name, sha256, class_names).
    """
    if source:
        x, y, sha = load_source_npz(source)
        name, class_names = Path(source).name, spec.class_names
    else:
        x, y, name, class_names = load_default(raw_dir)
        sha = None
    x = to_uint8_nchw(x, spec.image_shape)
    y = np.asarray(y, dtype=np.int64)
    if len(y) == 0 or y.min() < 0 or y.max() >= spec.num_classes:
        raise DatasetError(f"labels must lie in 0..{spec.num_classes - 1}"
                           + (f", got {y.min()}..{y.max()}" if len(y) else ", got no samples"))
    return x, y, name, sha or arrays_sha256(x, y), class_names


def stratified_subsample(y, n, rng):
    """Sorted indices of ``n`` samples, each class keeping its share of ``y`` (largest remainders)."""
    if not 0 < n <= len(y):
        raise DatasetError(f"--subsample must be between 1 and {len(y)}, got {n}")
    classes, counts = np.unique(y, return_counts=True)
    exact = counts * n / len(y)
    take = np.floor(exact).astype(int)
    take[np.argsort(take - exact)[: n - take.sum()]] += 1
    keep = [rng.choice(np.flatnonzero(y == c), size=k, replace=False) for c, k in zip(classes, take)]
    return np.sort(np.concatenate(keep))


def generate_images(spec, argv, load_default):
    """Full flow of an image generator; load_default(raw_dir) -> (x, y, source, class_names)."""
    parser = common_parser(f"Partition {spec.name} among federated clients.",
                           least_rule=f"int(min(10/(1-train_ratio), mean client size * {spec.least_share})); "
                                      f"exdir: int(min(10, mean client size * {spec.least_share})) as PFLlib")
    args = parser.parse_args(argv)
    check_common(parser, args)
    scheme = resolve_partition(parser, args, spec.num_classes, spec.default_class_per_client)
    out_dir = (Path(args.root).resolve() if args.root else DATASET_ROOT) / (args.out or spec.name)
    x, y, source, sha, class_names = load_images(spec, args.source, out_dir / "rawdata", load_default)
    if args.subsample is not None:
        keep = stratified_subsample(y, args.subsample, np.random.default_rng([args.seed, 0x5AB5]))
        x, y = x[keep], y[keep]
    least = args.least_samples or default_least_samples(args.train_ratio, len(y), args.num_clients,
                                                        spec.least_share, scheme["partition"])
    channels = spec.image_shape[0]
    config = dict(dataset=spec.name, num_clients=args.num_clients, num_classes=spec.num_classes, **scheme,
                  train_ratio=args.train_ratio, least_samples=least, seed=args.seed, source=source,
                  subsample=args.subsample,
                  source_sha256=sha, input_shape=list(spec.image_shape), x_dtype="uint8",
                  normalize={"mean": [0.5] * channels, "std": [0.5] * channels},
                  class_names=list(class_names) if class_names else None, format_version=FORMAT_VERSION)

    def make_split():
        part_rng, split_rng = np_generators(args.seed)
        clients = partition(y, args.num_clients, part_rng, scheme["partition"], alpha=scheme["alpha"],
                            class_per_client=scheme["class_per_client"], balance=scheme["balance"],
                            least_samples=least, layout=scheme["layout"])
        train_idx, test_idx = zip(*(split_train_test(idx, args.train_ratio, split_rng) for idx in clients))
        return x, y, list(train_idx), list(test_idx)

    write_or_skip(out_dir, config, make_split, args.plot, args.overwrite)
    return 0
