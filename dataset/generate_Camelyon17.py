"""Federated Camelyon17-WILDS (Bandi et al. 2018, Koh et al. 2021; 455,954 tumour / normal tissue patches, 5 hospitals).

Real world, as PFLlib: one client per hospital (center 0..4), 96x96 RGB patches, label
tumor (2 classes). Source: the ``wilds`` package's download when installed, or
``--source`` the WILDS folder ``camelyon17_v1.0`` (or its archive): ``metadata.csv`` (columns
patient, node, x_coord, y_coord, tumor, slide, center, split) and
``patches/patient_<ppp>_node_<n>/patch_patient_<ppp>_node_<n>_x_<x>_y_<y>.png``; the csv and
images are read directly (the package is optional). Writes::

    Camelyon17/train/<i>.npz, Camelyon17/test/<i>.npz   x uint8 [n, 3, 96, 96], y int64 [n]
    Camelyon17/config.json                             client_groups: the hospital of each client

Example::

    python dataset/generate_Camelyon17.py --subsample 50000
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import csv  # noqa: E402

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="Camelyon17", scenario="real world", modality="image", num_classes=2, input_shape=(3, 96, 96),
               default_model="CNN", clients="5 hospitals", raw_name="camelyon17_v1.0",
               where="WILDS (pip install wilds, or https://worksheets.codalab.org/rest/bundles/"
                     "0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/ unpacked)", fetch="wilds", image_size=96,
               normalize=False)


def load(src, args):
    """Rows of metadata.csv: patch file from patient, node, x, y; label tumor; client center."""
    folder = rd.find_dir(src, "metadata.csv")
    if folder is None:
        raise DatasetError(f"no metadata.csv under {src}; pass the camelyon17_v1.0 folder")
    paths, labels, centers = [], [], []
    with rd.open_text(folder / "metadata.csv") as f:
        for row in csv.DictReader(f):
            p, n = int(row["patient"]), int(row["node"])
            paths.append(folder / "patches" / f"patient_{p:03d}_node_{n}" /
                         f"patch_patient_{p:03d}_node_{n}_x_{int(row['x_coord'])}_y_{int(row['y_coord'])}.png")
            labels.append(int(row["tumor"]))
            centers.append(int(row["center"]))
    if not paths:
        raise DatasetError(f"{folder / 'metadata.csv'} lists no patches")
    centers = np.array(centers, dtype=np.int64)
    return Loaded(x=rd.read_images(paths, (3, args.image_size, args.image_size)), y=np.array(labels, dtype=np.int64),
                  groups=centers, group_names=[f"hospital {c}" for c in range(centers.max() + 1)],
                  class_names=["normal", "tumor"])


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
