"""Partition CIFAR-10 (60,000 32x32 colour images, 10 classes) among federated clients.

Train and test images are merged and re-split per client; HWC images are stored
channels first. Writes, next to this file (or under ``--root``)::

    Cifar10/train/<i>.npz, Cifar10/test/<i>.npz   x uint8 [n, 3, 32, 32], y int64 [n]
    Cifar10/config.json                           every parameter, source checksum, per-client stats

Examples (PFLlib's positional form and the named flags are equivalent)::

    python dataset/generate_Cifar10.py noniid - dir --source cifar10.npz
    python dataset/generate_Cifar10.py --partition pat --class-per-client 2 --source cifar10_partial.npz
    python dataset/generate_Cifar10.py noniid - pat          # downloads with torchvision

Expected summary for the first example (seed 1; the partial file holds 58,490 images)::

    client  train   test      0     1     2     3     4     5     6     7     8     9
         0     82     28      0     0     0    62     0    48     0     0     0     0
         1   2661    887   1339     0  2209     0     0     0     0     0     0     0
         2   3016   1006     23     0    42     0   419  3538     0     0     0     0
       ...
    total: 20 clients, 58490 samples (train 43866, test 14624); client size min 86 max 6758
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from dataset.utils.dataset_utils import ImageSpec, download_torchvision, generate_images, run_cli  # noqa: E402

SPEC = ImageSpec(name="Cifar10", num_classes=10, image_shape=(3, 32, 32), torchvision_class="CIFAR10",
                 class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                              "truck"))


def load_default(raw_dir):
    """Download CIFAR-10 with torchvision into raw_dir; returns (x, y, source, class_names)."""
    x, y, _ = download_torchvision(SPEC.torchvision_class, raw_dir, "CIFAR-10")
    return x, y, "torchvision", SPEC.class_names


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate_images(SPEC, argv, load_default)


if __name__ == "__main__":
    sys.exit(run_cli(main))
