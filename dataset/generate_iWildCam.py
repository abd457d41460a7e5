"""Federated iWildCam-WILDS (Beery et al. 2021, Koh et al. 2021; camera-trap photos of 182 animal classes).

Real world, as PFLlib: one client per camera trap (location), keeping traps with more than
100 photos (--least-samples 101) and more than 2 classes; images resized to 64x64. Source:
the ``wilds`` package's download when installed, or ``--source`` the WILDS folder
``iwildcam_v2.0`` (or its archive): ``metadata.csv`` (columns include location_remapped,
y, filename), images in ``train/<filename>``, ``categories.csv`` (y, name) when present; the
csv and images are read directly (the package is optional). Writes::

    iWildCam/train/<i>.npz, iWildCam/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    iWildCam/config.json                           client_groups: the camera trap of each client

Example::

    python dataset/generate_iWildCam.py
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import csv  # noqa: E402

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="iWildCam", scenario="real world", modality="image", num_classes=182, input_shape=(3, 64, 64),
               default_model="CNN", clients="camera traps (> 100 photos, > 2 classes)", raw_name="iwildcam_v2.0",
               where="WILDS (pip install wilds, or https://worksheets.codalab.org/rest/bundles/"
                     "0x6313da2b204647e79a14b468131fcd64/contents/blob/ unpacked)", fetch="wilds", image_size=64,
               natural_least=101)


def load(src, args):
    """Rows of metadata.csv of traps with more than 2 classes (the size rule is --least-samples)."""
    folder = rd.find_dir(src, "metadata.csv")
    if folder is None:
        raise DatasetError(f"no metadata.csv under {src}; pass the iwildcam_v2.0 folder")
    with rd.open_text(folder / "metadata.csv") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise DatasetError(f"{folder / 'metadata.csv'} lists no images")
    traps = np.array([int(r["location_remapped"]) for r in rows], dtype=np.int64)
    y = np.array([int(r["y"]) for r in rows], dtype=np.int64)
    varied = {t for t in np.unique(traps) if len(np.unique(y[traps == t])) > 2}
    keep = [i for i, t in enumerate(traps) if t in varied]
    names, num_classes = None, SPEC.num_classes
    if (folder / "categories.csv").is_file():
        with rd.open_text(folder / "categories.csv") as f:
            cats = sorted((int(r["y"]), r["name"]) for r in csv.DictReader(f))
        names, num_classes = [n for _, n in cats], len(cats)
    paths = [folder / "train" / rows[i]["filename"] for i in keep]
    return Loaded(x=rd.read_images(paths, (3, args.image_size, args.image_size)), y=y[keep], groups=traps[keep],
                  group_names=[f"trap {t}" for t in range(traps.max() + 1)], class_names=names,
                  num_classes=max(num_classes, int(y.max()) + 1))


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
