"""The common flow of the dataset zoo's generators (every scenario, every modality).

A generator declares a ``ZooSpec`` and a ``load(src, args)`` function that parses
the dataset's official layout into a ``Loaded`` (arrays plus, for natural clients
and domains, a group id per sample). ``generate`` does the rest:

- **source**: ``--source PATH`` (the official archive, the folder it unpacks to,
  or an npz with ``x``, ``y`` and optionally ``groups``); otherwise
  ``<root>/<out>/rawdata/<spec.raw_name>``; otherwise a download (torchvision or
  the official URL); offline, one line naming the file and where to put it.
- **clients**, by scenario:
  ``label skew``: the label partitioners (iid / pat / dir / exdir) as for MNIST;
  ``real world``: one client per natural group (writer, subject, hospital, camera;
  ``--num-clients N`` keeps the N largest), or a label partition on request
  (``--partition`` or the positional form);
  ``feature shift``: one domain per client, or ``--clients-per-domain k`` clients
  per domain, each domain split by the chosen scheme (default iid).
- **writes** the usual split (``save_split``) with config keys ``scenario``,
  ``modality`` (image | text | vector | series), ``default_model``,
  ``client_groups`` (the natural group or domain of each client) and any
  dataset-specific keys (``vocab_size`` for text), plus extra files such as
  ``vocab.txt``.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dataset.utils import dataset_utils as du
from dataset.utils.partition import partition, split_train_test
from dataset.utils import readers as rd
from dataset.utils.readers import extract, is_archive

SCENARIOS = ("label skew", "feature shift", "real world")
MODALITIES = {"image": "uint8", "text": "int64", "vector": "float32", "series": "float32"}


@dataclass(frozen=True)
class ZooSpec:
    """What the registry and the flow know about one dataset.

    ``raw_name`` is the file or folder expected under ``rawdata/`` (or given as
    ``--source``); ``url`` downloads it directly, ``fetch`` names the package that
    downloads it instead ("torchvision" or "wilds"); neither: a manual download from
    ``where``. ``image_size`` (images only) is the default side length, changed with
    ``--image-size``. ``natural_least`` is the least samples a natural group needs
    to become a client.
    """
    name: str
    scenario: str
    modality: str
    num_classes: int
    input_shape: tuple
    default_model: str
    clients: str
    raw_name: str
    where: str
    url: str | None = None
    fetch: str | None = None
    default_class_per_client: int = 2
    least_share: float = 0.5
    image_size: int | None = None
    natural_least: int = 2
    normalize: bool = True


@dataclass
class Loaded:
    """Parsed data: x, int64 labels y, optional group id per sample (natural client or domain)."""
    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None
    group_names: list | None = None
    class_names: list | None = None
    num_classes: int | None = None
    extra: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)


def offline_error(spec, raw_dir):
    return du.DatasetError(f"{spec.name} needs {spec.raw_name}: download it from {spec.where} and put it in "
                           f"{raw_dir}/ (or pass --source PATH)")


def resolve_source(spec, source, raw_dir):
    """The path to parse: --source (unpacked when an archive), rawdata/<raw_name>, or a download.

    Returns (path, name for config.json). Torchvision-backed datasets return raw_dir
    itself when nothing is there yet: their loader downloads into it.
    """
    if source:
        path = Path(source)
        if not path.exists():
            raise du.DatasetError(f"--source {path} does not exist")
        name = path.name
    else:
        path = raw_dir / spec.raw_name
        unpacked = raw_dir / spec.raw_name.split(".")[0]
        if not path.exists() and unpacked.is_dir():
            path = unpacked
        if not path.exists():
            if spec.fetch == "torchvision":
                return raw_dir, "torchvision"
            if spec.fetch == "wilds":
                fetch_wilds(spec, raw_dir)
                return raw_dir, "wilds"
            if spec.url is None:
                raise offline_error(spec, raw_dir)
            from dataset.utils.readers import download
            try:
                download(spec.url, path)
            except du.DatasetError:
                raise offline_error(spec, raw_dir) from None
        name = spec.raw_name
    if is_archive(path):
        path = extract(path, raw_dir / (path.name.split(".")[0] + "_files"))
    return path, name


def download_folder(raw_dir):
    """The folder another package downloads into: ``<root>/<out>/rawdata``, made and checked by the I/O layer
    (every component a real folder, no symlink on the way inside the split)."""
    raw_dir = Path(raw_dir)
    du.split_folder(raw_dir.parent).sub(raw_dir.name, what="download folder")
    return raw_dir


def fetch_torchvision(spec, raw_dir, make):
    """Download into raw_dir through ``make(root)`` (a torchvision dataset built with download=True)."""
    try:
        make(str(download_folder(raw_dir)))
    except (OSError, RuntimeError, ValueError):
        raise offline_error(spec, raw_dir) from None


def fetch_wilds(spec, raw_dir):
    """Download a WILDS dataset with the optional ``wilds`` package (its official layout, metadata.csv)."""
    try:
        import wilds
    except ImportError:
        raise offline_error(spec, raw_dir) from None
    try:
        wilds.get_dataset(dataset=spec.name.lower(), root_dir=str(download_folder(raw_dir)), download=True)
    except (OSError, RuntimeError, ValueError):
        raise offline_error(spec, raw_dir) from None


def is_plain_npz(path):
    """An npz prepared for the generic path (it holds an array ``x``), as opposed to an official npz."""
    if path.suffix != ".npz" or not path.is_file():
        return False
    try:  # its zip directory only, through the I/O layer (a regular file)
        return "x" in du.fileio.npz_names(path, "--source")
    except du.fileio.FileIOError:
        return False


def load_npz(path, spec):
    """A prepared npz: arrays x, y and optionally groups (natural client / domain id per sample)."""
    x, y, _ = du.load_source_npz(path)
    try:  # headers checked before the array is read (system/utils/fileio.py)
        has_groups = "groups" in du.fileio.npz_names(path, "--source")
        groups = (du.fileio.read_npz(path, ("groups",), "--source", ratio=du.UNPACK_LIMIT["ratio"])["groups"]
                  .astype(np.int64) if has_groups else None)
    except (du.fileio.FileIOError, ValueError, TypeError) as e:
        raise du.DatasetError(f"--source {Path(path).name}: its 'groups' cannot be read ({e})") from None
    if spec.scenario != "label skew" and groups is None:
        raise du.DatasetError(f"--source {Path(path).name} lacks the array 'groups' (the natural client or "
                              f"domain of each sample) that {spec.name} needs")
    extra = {}
    if spec.modality == "text":  # no vocabulary file: the ids are taken as they are
        extra = {"vocab_size": int(max(x.max(initial=0), 1)) + 1, "vocab_file": None}
    return Loaded(x=x, y=y, groups=groups, extra=extra)


def add_zoo_flags(parser, spec):
    if spec.scenario == "feature shift":
        parser.add_argument("--clients-per-domain", type=int, default=1,
                            help="clients per domain; each domain is split among them by the partition "
                                 "scheme (default 1: one client per domain)")
    if spec.image_size:
        parser.add_argument("--image-size", type=int, default=spec.image_size,
                            help=f"images are resized to this side length (default {spec.image_size}, as PFLlib)")


def input_shape(spec, args):
    if spec.modality == "image" and spec.image_size:
        return (spec.input_shape[0], args.image_size, args.image_size)
    if spec.modality == "text" and hasattr(args, "max_len"):
        return (args.max_len,)
    return tuple(spec.input_shape)


def _check_arrays(spec, loaded, shape, num_classes):
    x = loaded.x
    if spec.modality == "image":
        x = du.to_uint8_nchw(x, shape)
    elif spec.modality == "text":
        x = np.asarray(x, dtype=np.int64)
    else:
        x = np.asarray(x, dtype=np.float32)
    if spec.modality != "image" and tuple(x.shape[1:]) != tuple(shape):
        raise du.DatasetError(f"expected samples of shape {list(shape)}, got {list(x.shape[1:])}")
    y = np.asarray(loaded.y, dtype=np.int64)
    if len(y) == 0 or len(y) != len(x) or y.min() < 0 or y.max() >= num_classes:
        raise du.DatasetError(f"labels must lie in 0..{num_classes - 1}, one per sample"
                              + (f"; got {y.min()}..{y.max()} for {len(y)} labels and {len(x)} samples"
                                 if len(y) else "; got no samples"))
    return x, y


def natural_clients(groups, num_clients, least):
    """Groups with at least ``least`` samples, the ``num_clients`` largest (all when None), in group order.

    Returns (group ids, index array per group).
    """
    ids, counts = np.unique(groups, return_counts=True)
    ok = counts >= least
    if not ok.any():
        raise du.DatasetError(f"no natural client has at least {least} samples; lower --least-samples")
    ids, counts = ids[ok], counts[ok]
    if num_clients is not None:
        if num_clients > len(ids):
            raise du.DatasetError(f"--num-clients {num_clients} exceeds the {len(ids)} natural clients with at "
                                  f"least {least} samples")
        ids = np.sort(ids[np.argsort(-counts, kind="stable")[:num_clients]])
    return ids, [np.flatnonzero(groups == g) for g in ids]


def _parse(spec, argv, add_flags):
    natural = spec.scenario != "label skew"
    parser = du.common_parser(
        f"Partition {spec.name} among federated clients ({spec.scenario}).",
        num_clients=None if natural else 20,
        least_rule=("2 (natural clients with fewer samples are left out)" if natural
                    else f"int(min(10/(1-train_ratio), mean client size * {spec.least_share}))"),
        source_help=f"local copy: {spec.raw_name} (the archive or the folder it unpacks to, official layout) or "
                    f"an npz with arrays x, y" + (", groups" if natural else "") + " (default: rawdata/, else download)")
    add_zoo_flags(parser, spec)
    if add_flags:
        add_flags(parser)
    args = parser.parse_args(argv)
    du.check_common(parser, args)
    relabel = natural and (args.partition or args.niid or args.partition_pos)
    if spec.scenario == "feature shift":
        if args.num_clients is not None:
            parser.error("--num-clients is set by the domains; use --clients-per-domain")
        if args.clients_per_domain < 1:
            parser.error(f"--clients-per-domain must be >= 1, got {args.clients_per_domain}")
        if args.clients_per_domain == 1:
            if relabel:
                parser.error("a label partition within each domain needs --clients-per-domain > 1")
            scheme = {"partition": "domain", "alpha": None, "class_per_client": None, "balance": None, "layout": None}
        else:
            scheme = du.resolve_partition(parser, args, spec.num_classes, spec.default_class_per_client)
            if not relabel:
                scheme.update(partition="iid", class_per_client=spec.num_classes)
    elif spec.scenario == "real world" and not relabel:
        scheme = {"partition": "natural", "alpha": None, "class_per_client": None, "balance": None, "layout": None}
        for flag in ("alpha", "class_per_client", "balance", "layout"):
            if getattr(args, flag) is not None:
                parser.error(f"--{flag.replace('_', '-')} needs a label partition (--partition); natural clients "
                             f"come from the data")
    else:
        if natural and args.num_clients is None:
            args.num_clients = 20
        scheme = du.resolve_partition(parser, args, spec.num_classes, spec.default_class_per_client)
    if getattr(args, "image_size", 8) < 8:
        parser.error(f"--image-size must be >= 8, got {args.image_size}")
    return args, scheme


def _assign(spec, args, scheme, y, groups, least):
    """Client index arrays (before the train/test split) and each client's group name index."""
    part_rng, _ = du.np_generators(args.seed)
    kw = dict(alpha=scheme["alpha"], class_per_client=scheme["class_per_client"], balance=scheme["balance"],
              least_samples=least, layout=scheme["layout"])
    if scheme["partition"] == "natural":
        ids, clients = natural_clients(groups, args.num_clients, least)
        return clients, ids.tolist()
    if spec.scenario == "feature shift":
        clients, owners = [], []
        k = args.clients_per_domain
        for g in np.unique(groups):
            idx = np.flatnonzero(groups == g)
            parts = [np.arange(len(idx))] if k == 1 else partition(y[idx], k, part_rng, scheme["partition"], **kw)
            clients += [idx[p] for p in parts]
            owners += [int(g)] * len(parts)
        return clients, owners
    return partition(y, args.num_clients, part_rng, scheme["partition"], **kw), None


def _default_least(spec, args, scheme, y, groups):
    """Natural clients: the spec's minimum group size. A whole domain: 2 (one train, one test sample).
    Otherwise PFLlib's rule (``default_least_samples``) over the samples being partitioned."""
    if scheme["partition"] == "natural":
        return spec.natural_least
    if spec.scenario == "feature shift":
        if args.clients_per_domain == 1:
            return 2
        smallest = int(np.unique(groups, return_counts=True)[1].min())
        return du.default_least_samples(args.train_ratio, smallest, args.clients_per_domain, spec.least_share,
                                        scheme["partition"])
    return du.default_least_samples(args.train_ratio, len(y), args.num_clients, spec.least_share, scheme["partition"])


def generate(spec, argv, load, add_flags=None):
    """Full flow of a zoo generator; ``load(src_path, args) -> Loaded`` parses the official layout."""
    args, scheme = _parse(spec, argv, add_flags)
    out_dir = (Path(args.root).resolve() if args.root else du.DATASET_ROOT) / (args.out or spec.name)
    src, source_name = resolve_source(spec, args.source, out_dir / "rawdata")
    args.download = source_name in ("torchvision", "wilds")  # the loader fetches into src (= rawdata/) first
    loaded = load_npz(src, spec) if is_plain_npz(src) else load(src, args)
    num_classes = loaded.num_classes or spec.num_classes
    shape = input_shape(spec, args)
    x, y = _check_arrays(spec, loaded, shape, num_classes)
    groups = loaded.groups
    if args.subsample is not None:
        keep = du.stratified_subsample(y, args.subsample, np.random.default_rng([args.seed, 0x5AB5]))
        x, y = x[keep], y[keep]
        groups = groups[keep] if groups is not None else None
    least = args.least_samples or _default_least(spec, args, scheme, y, groups)
    clients, owners = _assign(spec, args, scheme, y, groups, least)
    if owners is not None and loaded.group_names is not None:
        owners = [loaded.group_names[g] for g in owners]
    channels = shape[0]
    config = dict(dataset=spec.name, scenario=spec.scenario, num_clients=len(clients), num_classes=num_classes,
                  **scheme, train_ratio=args.train_ratio, least_samples=least, seed=args.seed, source=source_name,
                  subsample=args.subsample, source_sha256=du.arrays_sha256(x, y, *(() if groups is None else (groups,))),
                  input_shape=list(shape), x_dtype=MODALITIES[spec.modality], modality=spec.modality,
                  default_model=spec.default_model,
                  normalize=({"mean": [0.5] * channels, "std": [0.5] * channels}
                             if spec.modality == "image" and spec.normalize else None),
                  class_names=list(loaded.class_names) if loaded.class_names else None,
                  client_groups=owners, format_version=du.FORMAT_VERSION, **loaded.extra)
    if spec.scenario == "feature shift":
        config["clients_per_domain"] = args.clients_per_domain

    def make_split():
        _, split_rng = du.np_generators(args.seed)
        train_idx, test_idx = zip(*(split_train_test(idx, args.train_ratio, split_rng) for idx in clients))
        folder = du.split_folder(out_dir)  # the split's folder, made and checked by the I/O layer
        for fname, text in loaded.files.items():
            folder.replace([(fname, lambda f, text=text: f.write(text.encode()))])
        return x, y, list(train_idx), list(test_idx)

    du.write_or_skip(out_dir, config, make_split, args.plot, args.overwrite)
    return 0


def csv_text_loader(archive: str):
    """The loader of a character-level-CNN-style text archive (``archive``: AG News, Sogou News): train.csv
    and test.csv tokenised, the vocabulary from train.csv only, saved beside the split."""

    def load(src, args):
        folder = rd.find_dir(src, "train.csv")
        if folder is None:
            raise du.DatasetError(f"no train.csv under {src}; pass {archive} or the folder it unpacks to")
        if args.vocab_size < 3 or args.max_len < 1:
            raise du.DatasetError("--vocab-size must be >= 3 and --max-len >= 1")
        x, y, names, vocab = rd.char_cnn_csv(folder, args.vocab_size, args.max_len)
        return Loaded(x=x, y=y, class_names=names, extra={"vocab_size": len(vocab), "max_len": args.max_len,
                                                          "vocab_file": "vocab.txt"},
                      files={"vocab.txt": rd.vocab_text(vocab)})

    return load
