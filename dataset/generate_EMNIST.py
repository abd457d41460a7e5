"""Partition EMNIST (Cohen et al. 2017; handwritten digits and letters, 28x28) among federated clients.

Label skew, as PFLlib (split "digits": 280,000 images, 10 classes). Source: torchvision's
download (the NIST gzip.zip), or ``--source`` the folder holding the IDX files
``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]`` (torchvision's
``EMNIST/raw``, or the unpacked gzip.zip). Images are stored upright (the IDX files hold
them transposed; PFLlib keeps them transposed). "letters" labels 1..26 become 0..25. Writes::

    EMNIST/train/<i>.npz, EMNIST/test/<i>.npz   x uint8 [n, 1, 28, 28], y int64 [n]
    EMNIST/config.json

Example::

    python dataset/generate_EMNIST.py noniid - dir --split digits
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, fetch_torchvision, generate  # noqa: E402

SPLITS = {"digits": 10, "mnist": 10, "balanced": 47, "bymerge": 47, "byclass": 62, "letters": 26}
DEFAULT_CLASSES = SPLITS["digits"]  # the default split's classes, as generate.py --list shows them
SPEC = ZooSpec(name="EMNIST", scenario="label skew", modality="image", num_classes=62, input_shape=(1, 28, 28),
               default_model="CNN", clients="20 (partitioned)", raw_name="EMNIST",
               where="https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip (torchvision downloads it)",
               fetch="torchvision")


def add_flags(parser):
    parser.add_argument("--split", choices=list(SPLITS), default="digits",
                        help="EMNIST split (default digits, as PFLlib)")


def load(src, args):
    """Read the chosen split's four IDX files (train and test are merged)."""
    marker = f"emnist-{args.split}-train-images-idx3-ubyte"
    folder = rd.find_dir(src, marker) or rd.find_dir(src, marker + ".gz")
    if folder is None and args.download:
        from torchvision import datasets
        fetch_torchvision(SPEC, src, lambda root: datasets.EMNIST(root, split=args.split, download=True))
        folder = rd.find_dir(src, marker)
    if folder is None:
        raise DatasetError(f"no {marker} under {src}; pass the folder holding the EMNIST IDX files")
    xs, ys = [], []
    for part in ("train", "test"):
        stem = folder / f"emnist-{args.split}-{part}"
        gz = "" if (folder / f"emnist-{args.split}-{part}-images-idx3-ubyte").is_file() else ".gz"
        xs.append(rd.read_idx(f"{stem}-images-idx3-ubyte{gz}").transpose(0, 2, 1))
        ys.append(rd.read_idx(f"{stem}-labels-idx1-ubyte{gz}").astype(np.int64))
    y = np.concatenate(ys) - (1 if args.split == "letters" else 0)
    return Loaded(x=np.concatenate(xs), y=y, num_classes=SPLITS[args.split])


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load, add_flags)


if __name__ == "__main__":
    sys.exit(run_cli(main))
