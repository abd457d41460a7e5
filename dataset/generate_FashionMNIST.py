"""Partition Fashion-MNIST (70,000 clothing images, 10 classes) among federated clients.

Train and test images are merged and re-split per client. Writes, next to this
file (or under ``--root``)::

    FashionMNIST/train/<i>.npz, FashionMNIST/test/<i>.npz   x uint8 [n, 1, 28, 28], y int64 [n]
    FashionMNIST/config.json                                every parameter, source checksum, per-client stats

Examples (PFLlib's positional form and the named flags are equivalent)::

    python dataset/generate_FashionMNIST.py noniid - dir --source fmnist.npz
    python dataset/generate_FashionMNIST.py --partition dir --alpha 0.1 --num-clients 20 --source fmnist.npz
    python dataset/generate_FashionMNIST.py noniid - pat   # downloads with torchvision

Expected summary for the first example (seed 1; the rows vary with the seed)::

    client  train   test      0     1     2     3     4     5     6     7     8     9
         0     98     33      0     0     0    74     0    57     0     0     0     0
         1   3185   1062   1603     0  2644     0     0     0     0     0     0     0
         2   3610   1203     27     0    50     0   502  4234     0     0     0     0
       ...
    total: 20 clients, 70000 samples (train 52500, test 17500); client size min 102 max 8087
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from dataset.utils.dataset_utils import ImageSpec, download_torchvision, generate_images, run_cli  # noqa: E402

SPEC = ImageSpec(name="FashionMNIST", num_classes=10, image_shape=(1, 28, 28), torchvision_class="FashionMNIST",
                 class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                              "Shirt", "Sneaker", "Bag", "Ankle boot"))


def load_default(raw_dir):
    """Download Fashion-MNIST with torchvision into raw_dir; returns (x, y, source, class_names)."""
    x, y, _ = download_torchvision(SPEC.torchvision_class, raw_dir, SPEC.name)
    return x, y, "torchvision", SPEC.class_names


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate_images(SPEC, argv, load_default)


if __name__ == "__main__":
    sys.exit(run_cli(main))
