"""Partition Oxford Flowers-102 (Nilsback & Zisserman 2008; 8,189 images, 102 classes) among federated clients.

Label skew, as PFLlib: train, validation and test images merged, resized to 64x64,
10 classes per client under ``pat``. Source: torchvision's download, or ``--source`` the
``flowers-102`` folder (``jpg/image_00001.jpg`` ..., ``imagelabels.mat`` with labels 1..102).
Writes::

    Flowers102/train/<i>.npz, Flowers102/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    Flowers102/config.json

Example::

    python dataset/generate_Flowers102.py noniid - dir
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, fetch_torchvision, generate  # noqa: E402

SPEC = ZooSpec(name="Flowers102", scenario="label skew", modality="image", num_classes=102,
               input_shape=(3, 64, 64), default_model="CNN", clients="20 (partitioned)", raw_name="flowers-102",
               where="https://thor.robots.ox.ac.uk/flowers/102/ (torchvision downloads it)", fetch="torchvision",
               default_class_per_client=10, image_size=64)


def load(src, args):
    """Labels from imagelabels.mat; image i (from 1) is jpg/image_<i:05d>.jpg."""

    folder = rd.find_dir(src, "imagelabels.mat")
    if folder is None and args.download:
        from torchvision import datasets
        fetch_torchvision(SPEC, src, lambda root: datasets.Flowers102(root, download=True))
        folder = rd.find_dir(src, "imagelabels.mat")
    if folder is None:
        raise DatasetError(f"no imagelabels.mat under {src}; pass the flowers-102 folder")
    labels = rd.read_mat(folder / "imagelabels.mat", squeeze_me=True)["labels"]
    labels = np.atleast_1d(labels).astype(np.int64) - 1
    paths = [folder / "jpg" / f"image_{i:05d}.jpg" for i in range(1, len(labels) + 1)]
    return Loaded(x=rd.read_images(paths, (3, args.image_size, args.image_size)), y=labels)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
