"""Readers shared by the dataset zoo: locating a source, archives, images, text.

Every generator reads its dataset's official on-disk layout with these helpers, so
a local copy (``--source``: the archive, the folder it unpacks to, or an npz) and
a fresh download go through the same parsing code.

Text: a small tokenizer in the spirit of torchtext's ``basic_english``
(lower case; words, numbers and single punctuation marks), a vocabulary of the
most frequent tokens with ``<pad>`` = 0 and ``<unk>`` = 1, and fixed-length id
arrays padded with 0. The vocabulary is saved as ``vocab.txt`` beside the
split's ``config.json`` (line i holds the token of id i).
"""

import io
import re
import shutil
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np

from dataset.utils.dataset_utils import UNPACK_LIMIT, DatasetError, fileio

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".gif", ".tif", ".tiff")
PAD, UNK = "<pad>", "<unk>"


def is_archive(path):
    return Path(path).is_file() and str(path).lower().endswith(ARCHIVE_SUFFIXES)


def extract(archive, dest):
    """Unpack a zip or tar archive into ``dest`` (once: a marker file records completion); returns dest.

    Through the I/O layer (``fileio.extract``): every member's header is checked before anything is written.
    Members that would land outside ``dest`` (absolute paths, ``..``) or are not plain files and folders
    (symlinks, hard links, devices, FIFOs) are refused, and so are more than ``fileio.ARCHIVE_MEMBERS`` members
    or more than ``--max-unpack-ratio`` times the archive's size; no symlink at ``dest`` or inside it is followed.
    """
    archive, dest = Path(archive), Path(dest)
    marker = f".{archive.name}.extracted"
    try:
        # the archive's folder a real one: a symlink planted at its name is refused, never followed
        folder = fileio.Folder(dest.parent, what="archive folder").sub(dest.name)
        if folder.is_file(marker):
            return dest
        fileio.extract(archive, folder, "archive", ratio=UNPACK_LIMIT["ratio"],
                       hint=" (raise the cap with --max-unpack-ratio if you trust it)")
        fileio.write_bytes(folder, marker, b"")
    except fileio.FileIOError as err:
        raise DatasetError(str(err)) from None
    return dest


def find_dir(root, marker):
    """The folder under ``root`` (root itself included) that contains the relative path ``marker``.

    Archives found on the way are unpacked next to themselves, one level deep, so a
    download that nests a zip in a zip (UCI HAR) is found too. None when absent.
    """
    root = Path(root)
    if is_archive(root):
        root = extract(root, root.parent / (root.name.split(".")[0] + "_files"))
    if not root.is_dir():
        return None
    for attempt in range(2):
        quick = [d for d in (root, *sorted(root.iterdir())) if (d / marker).is_file() or (d / marker).is_dir()]
        if quick:
            return quick[0]
        hits = sorted(p for p in root.rglob(Path(marker).name) if p.as_posix().endswith("/" + marker))
        for hit in hits:
            base = hit.parent
            for _ in Path(marker).parent.parts:
                base = base.parent
            return base
        if attempt == 0:
            archives = [p for p in sorted(root.rglob("*")) if is_archive(p)]
            if not archives:
                return None
            for a in archives:
                extract(a, a.parent)
    return None


def download(url, dest):
    """Fetch ``url`` to ``dest`` through the I/O layer (a temporary file created exclusively in the download
    folder, a real folder inside ``--out``, then renamed into place); raises DatasetError when offline."""
    dest = Path(dest)
    try:
        folder = fileio.Folder(dest.parent.parent, what="--out").sub(dest.parent.name, what="download folder")
        with urllib.request.urlopen(url, timeout=60) as response:
            folder.replace([(dest.name, lambda f: shutil.copyfileobj(response, f))])
    except (urllib.error.URLError, OSError) as err:
        raise DatasetError(f"could not download {url} ({getattr(err, 'reason', err)})") from None
    except fileio.FileIOError as err:
        raise DatasetError(f"could not download {url} ({err})") from None
    return dest


def read_text(path, encoding="utf-8"):
    """A dataset's own text file (a listing, labels) through the I/O layer: a regular file, capped; line ends
    read as ``\n`` whatever they were (as ``Path.read_text``)."""
    return _text(path, encoding).replace("\r\n", "\n").replace("\r", "\n")


def open_text(path, encoding="utf-8"):
    """The same as a text file object, lines as written (``open(path, newline="")``: what csv reads)."""
    return io.StringIO(_text(path, encoding), newline="")


def _text(path, encoding):
    try:
        return fileio.read_text(path, "source file", cap=fileio.SOURCE_CAP, encoding=encoding)
    except fileio.FileIOError as err:
        raise DatasetError(str(err)) from None


def read_mat(path, **kwargs):
    """A MATLAB file (``scipy.io.loadmat``), its bytes read through the I/O layer."""
    from scipy.io import loadmat

    try:
        data = fileio.read_bytes(path, "source file", cap=fileio.SOURCE_CAP)
    except fileio.FileIOError as err:
        raise DatasetError(str(err)) from None
    return loadmat(io.BytesIO(data), **kwargs)


def read_image(path_or_image, image_shape):
    """One image as uint8 [C, H, W]: converted to gray (C = 1) or RGB (C = 3), resized bilinearly to H x W."""
    from PIL import Image

    channels, height, width = image_shape
    image = path_or_image
    try:
        if not isinstance(image, Image.Image):
            with fileio.open_read(path_or_image, "image", cap=fileio.SOURCE_CAP) as f, Image.open(f) as im:
                image = im.convert("L" if channels == 1 else "RGB")
        else:
            image = image.convert("L" if channels == 1 else "RGB")
    except (OSError, fileio.FileIOError) as err:
        raise DatasetError(f"cannot read image {path_or_image} ({err})") from None
    if image.size != (width, height):
        image = image.resize((width, height), Image.BILINEAR)
    a = np.asarray(image, dtype=np.uint8)
    return a[None] if channels == 1 else a.transpose(2, 0, 1)


def read_images(paths, image_shape):
    """Stack images into uint8 [N, C, H, W]."""
    out = np.empty((len(paths), *image_shape), dtype=np.uint8)
    for i, p in enumerate(paths):
        out[i] = read_image(p, image_shape)
    return out


def list_images(folder):
    """Image files directly in ``folder``, sorted by name."""
    return sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)


def image_folder(roots, image_shape):
    """An ImageFolder layout ``root/<class>/<image>``, or several (``roots``: a list, e.g. a dataset's train /
    valid / test folders, read in that order): classes are the sorted union of the sub-folder names.

    Returns (x uint8 [N, C, H, W], y int64 [N], class_names).
    """
    roots = [Path(r) for r in (roots if isinstance(roots, (list, tuple)) else [roots])]
    classes = sorted({p.name for r in roots for p in r.iterdir() if p.is_dir()})
    paths, labels = [], []
    for root in roots:
        for c, name in enumerate(classes):
            if (root / name).is_dir():
                files = list_images(root / name)
                paths += files
                labels += [c] * len(files)
    if not paths:
        raise DatasetError(f"no images found in class folders under {', '.join(map(str, roots))}")
    return read_images(paths, image_shape), np.array(labels, dtype=np.int64), classes


_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text):
    """Lower-cased words, numbers (with a trailing 's, 't, ...) and single punctuation marks."""
    return _TOKEN.findall(text.replace("\\n", " ").lower())


def build_vocab(token_lists, max_size):
    """``<pad>``, ``<unk>`` and the ``max_size - 2`` most frequent tokens (ties by token), as a list."""
    counts = Counter(t for tokens in token_lists for t in tokens)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [PAD, UNK] + [t for t, _ in ranked[: max(0, max_size - 2)]]


def encode(token_lists, vocab, max_len):
    """int64 [N, max_len]: each sequence's first max_len token ids (unknown -> 1), padded with 0."""
    index = {t: i for i, t in enumerate(vocab)}
    out = np.zeros((len(token_lists), max_len), dtype=np.int64)
    for row, tokens in enumerate(token_lists):
        ids = [index.get(t, 1) for t in tokens[:max_len]]
        out[row, : len(ids)] = ids
    return out


def vocab_text(vocab):
    """The vocabulary file's content: one token per line, line i = id i."""
    return "".join(f"{t}\n" for t in vocab)


def read_idx(path):
    """An IDX file (MNIST's format; gzip-compressed when it ends in .gz) as a uint8 array."""
    import gzip

    try:
        data = fileio.read_bytes(path, "source file", cap=fileio.SOURCE_CAP)
    except fileio.FileIOError as err:
        raise DatasetError(str(err)) from None
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    if len(data) < 4 or data[2] != 0x08:
        raise DatasetError(f"{Path(path).name} is not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = np.frombuffer(data, ">i4", ndim, 4).astype(int)
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def add_text_flags(parser, vocab_size=32000, max_len=200):
    """--vocab-size and --max-len, PFLlib's text settings by default."""
    parser.add_argument("--vocab-size", type=int, default=vocab_size,
                        help=f"vocabulary size including <pad> and <unk> (default {vocab_size}, as PFLlib)")
    parser.add_argument("--max-len", type=int, default=max_len,
                        help=f"token ids per sample, truncated or padded with 0 (default {max_len}, as PFLlib)")


def char_cnn_csv(folder, vocab_size, max_len):
    """The text-classification CSVs of Zhang et al. 2015 (AG News, Sogou News, ...): train.csv and test.csv
    rows "class index (from 1)","title","body"; classes.txt one name per line.

    The vocabulary is built from train.csv only (test text never shapes it). Returns
    (x int64 [N, max_len], y int64 [N], class_names, vocab).
    """
    import csv

    folder = Path(folder)
    tokens, labels = {}, {}
    csv.field_size_limit(1 << 24)
    for part in ("train", "test"):
        path = folder / f"{part}.csv"
        if not path.is_file():
            raise DatasetError(f"{path} is missing (expected train.csv and test.csv)")
        with open_text(path) as f:
            rows = [r for r in csv.reader(f) if r]
        bad = [r for r in rows if len(r) < 2 or not r[0].strip().isdigit()]
        if bad:
            raise DatasetError(f"{path.name}: rows must start with a class index, got {bad[0][:2]}")
        labels[part] = [int(r[0]) - 1 for r in rows]
        tokens[part] = [tokenize(" ".join(r[1:])) for r in rows]
    vocab = build_vocab(tokens["train"], vocab_size)
    x = encode(tokens["train"] + tokens["test"], vocab, max_len)
    y = np.array(labels["train"] + labels["test"], dtype=np.int64)
    names_file = folder / "classes.txt"
    names = read_text(names_file).split("\n") if names_file.is_file() else []
    return x, y, [n.strip() for n in names if n.strip()] or None, vocab


def read_leaf(src):
    """LEAF json files (one file, or every *.json under a folder, sorted by path), users pooled.

    Returns (user names in first-seen order, per-user x lists, per-user y lists); a user found
    in several files (LEAF's train/ and test/) has its samples concatenated.
    """
    import json

    src = Path(src)
    files = [src] if src.is_file() else sorted(src.rglob("*.json"))
    if not files:
        raise DatasetError(f"no LEAF .json files under {src}")
    order, xs, ys = [], {}, {}
    for path in files:
        try:
            data = json.loads(read_text(path))
            for user in data["users"]:
                if user not in xs:
                    order.append(user)
                    xs[user], ys[user] = [], []
                xs[user] += data["user_data"][user]["x"]
                ys[user] += data["user_data"][user]["y"]
        except (ValueError, KeyError, TypeError) as err:
            raise DatasetError(f"{path.name} is not a LEAF json (users, user_data: x, y): {err!r}") from None
    return order, [np.asarray(xs[u], dtype=np.float32) if xs[u] and not isinstance(xs[u][0], str) else xs[u]
                   for u in order], [ys[u] for u in order]
