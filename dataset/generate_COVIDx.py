"""Partition COVIDx CXR-2 (Wang et al. 2020; chest X-rays, COVID-19 positive / negative) among clients.

Label skew, as PFLlib: every listed split merged, resized to 64x64 RGB, not normalised
(PFLlib applies ToTensor only), 2 classes per client under ``pat``. Source (manual
download from Kaggle): ``--source`` the archive or its folder: ``train.txt``, ``test.txt``
(and ``val.txt`` if present), lines "patient_id filename label data_source", images in
``train/``, ``test/``, ``val/``. Classes are the sorted label names (negative, positive).
Writes::

    COVIDx/train/<i>.npz, COVIDx/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    COVIDx/config.json

Example::

    python dataset/generate_COVIDx.py noniid - dir --source archive.zip
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="COVIDx", scenario="label skew", modality="image", num_classes=2, input_shape=(3, 64, 64),
               default_model="CNN", clients="20 (partitioned)", raw_name="covidx-cxr2.zip",
               where="https://www.kaggle.com/datasets/andyczhao/covidx-cxr2 (save the archive as covidx-cxr2.zip)",
               image_size=64, normalize=False)


def load(src, args):
    """Read every <split>.txt label file; the image is <split>/<filename>."""
    folder = rd.find_dir(src, "train.txt")
    if folder is None:
        raise DatasetError(f"no train.txt under {src}; pass the COVIDx CXR-2 archive or its folder")
    paths, names = [], []
    for split in ("train", "val", "test"):
        listing = folder / f"{split}.txt"
        if listing.is_file():
            for line in rd.read_text(listing).split("\n"):
                cells = line.split()
                if len(cells) >= 3:
                    paths.append(folder / split / cells[1])
                    names.append(cells[2].lower())
    classes = sorted(set(names))
    if len(classes) > SPEC.num_classes:
        raise DatasetError(f"expected labels negative/positive, found {', '.join(classes)}")
    y = np.array([classes.index(n) for n in names], dtype=np.int64)
    return Loaded(x=rd.read_images(paths, (3, args.image_size, args.image_size)), y=y, class_names=classes)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
