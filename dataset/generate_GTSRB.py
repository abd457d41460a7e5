"""Partition GTSRB (Stallkamp et al. 2012; 51,839 traffic-sign images, 43 classes) among federated clients.

Label skew, as PFLlib: training and test images merged, resized to 32x32, 4 classes per
client under ``pat``. Source: torchvision's download, or ``--source`` the ``gtsrb`` folder
(official layout: ``GTSRB/Training/<class:05d>/*.ppm``, ``GTSRB/Final_Test/Images/*.ppm`` and
``GT-final_test.csv``, semicolon-separated with columns Filename and ClassId). Writes::

    GTSRB/train/<i>.npz, GTSRB/test/<i>.npz   x uint8 [n, 3, 32, 32], y int64 [n]
    GTSRB/config.json

Example::

    python dataset/generate_GTSRB.py noniid - pat
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import csv  # noqa: E402

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, fetch_torchvision, generate  # noqa: E402

SPEC = ZooSpec(name="GTSRB", scenario="label skew", modality="image", num_classes=43, input_shape=(3, 32, 32),
               default_model="CNN", clients="20 (partitioned)", raw_name="gtsrb",
               where="https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/ (torchvision downloads it)",
               fetch="torchvision", default_class_per_client=4, image_size=32)


def load(src, args):
    """Training images by class folder; test images labelled by GT-final_test.csv."""
    folder = rd.find_dir(src, "GTSRB/Training")
    if folder is None and args.download:
        from torchvision import datasets
        fetch_torchvision(SPEC, src, lambda root: [datasets.GTSRB(root, split=s, download=True)
                                                   for s in ("train", "test")])
        folder = rd.find_dir(src, "GTSRB/Training")
    if folder is None:
        raise DatasetError(f"no GTSRB/Training under {src}; pass the gtsrb folder")
    paths, labels = [], []
    for d in sorted((folder / "GTSRB/Training").iterdir()):
        if d.is_dir():
            files = rd.list_images(d)
            paths += files
            labels += [int(d.name)] * len(files)
    test_csv = folder / "GT-final_test.csv"
    if test_csv.is_file():
        with rd.open_text(test_csv) as f:
            for row in csv.DictReader(f, delimiter=";"):
                paths.append(folder / "GTSRB/Final_Test/Images" / row["Filename"])
                labels.append(int(row["ClassId"]))
    shape = (3, args.image_size, args.image_size)
    return Loaded(x=rd.read_images(paths, shape), y=np.array(labels, dtype=np.int64))


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
