"""Partition CIFAR-100 (60,000 32x32 colour images, 100 fine classes) among federated clients.

Train and test images are merged and re-split per client; HWC images are stored
channels first. The pathological default gives each client 10 classes (PFLlib's
setting for CIFAR-100). Writes, next to this file (or under ``--root``)::

    Cifar100/train/<i>.npz, Cifar100/test/<i>.npz   x uint8 [n, 3, 32, 32], y int64 [n]
    Cifar100/config.json                            every parameter, source checksum, per-client stats

Examples (PFLlib's positional form and the named flags are equivalent)::

    python dataset/generate_Cifar100.py noniid - dir                  # downloads with torchvision
    python dataset/generate_Cifar100.py --partition dir --alpha 0.1 --source cifar100.npz

With more than 20 classes the summary lists only the labels a client holds::

    client  train   test  label:count
         0    ...    ...  <label>:<count> for each label the client holds
    total: 20 clients, 60000 samples (train ..., test ...); client size min ... max ...
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from dataset.utils.dataset_utils import ImageSpec, download_torchvision, generate_images, run_cli  # noqa: E402

SPEC = ImageSpec(name="Cifar100", num_classes=100, image_shape=(3, 32, 32), default_class_per_client=10,
                 torchvision_class="CIFAR100")


def load_default(raw_dir):
    """Download CIFAR-100 with torchvision into raw_dir; returns (x, y, source, class_names)."""
    x, y, class_names = download_torchvision(SPEC.torchvision_class, raw_dir, "CIFAR-100")
    return x, y, "torchvision", class_names


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate_images(SPEC, argv, load_default)


if __name__ == "__main__":
    sys.exit(run_cli(main))
