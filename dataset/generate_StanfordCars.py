"""Partition Stanford Cars (Krause et al. 2013; 16,185 images, 196 classes) among federated clients.

Label skew, as PFLlib: train and test merged, resized to 64x64, 20 classes per client under
``pat``. Source: ``--source`` (or rawdata/) the ``stanford_cars`` folder in torchvision's
layout (``devkit/cars_meta.mat``, ``devkit/cars_train_annos.mat``, ``cars_train/``,
``cars_test/``, ``cars_test_annos_withlabels.mat``; annotations carry class 1..196 and
fname). The original URLs are gone, so torchvision no longer downloads it. Writes::

    StanfordCars/train/<i>.npz, StanfordCars/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    StanfordCars/config.json

Example::

    python dataset/generate_StanfordCars.py noniid - dir --source stanford_cars
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="StanfordCars", scenario="label skew", modality="image", num_classes=196,
               input_shape=(3, 64, 64), default_model="CNN", clients="20 (partitioned)", raw_name="stanford_cars",
               where="a mirror of the Stanford Cars dataset in torchvision's layout (e.g. Kaggle "
                     "jessicali9530/stanford-cars-dataset plus cars_test_annos_withlabels.mat)",
               default_class_per_client=20, image_size=64)


def load(src, args):
    """Images listed by the train and test annotation files (class, fname)."""
    folder = rd.find_dir(src, "devkit/cars_meta.mat")
    if folder is None:
        raise DatasetError(f"no devkit/cars_meta.mat under {src}; pass the stanford_cars folder")
    names = [str(n) for n in np.atleast_1d(rd.read_mat(folder / "devkit/cars_meta.mat", squeeze_me=True)["class_names"])]
    paths, labels = [], []
    for annos, images in (("devkit/cars_train_annos.mat", "cars_train"),
                          ("cars_test_annos_withlabels.mat", "cars_test")):
        if not (folder / annos).is_file():
            continue
        for a in np.atleast_1d(rd.read_mat(folder / annos, squeeze_me=True)["annotations"]):
            paths.append(folder / images / str(a["fname"]))
            labels.append(int(a["class"]) - 1)
    shape = (3, args.image_size, args.image_size)
    return Loaded(x=rd.read_images(paths, shape), y=np.array(labels, dtype=np.int64), class_names=names,
                  num_classes=len(names))


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
