"""Partition Kvasir v2 (Pogorelov et al. 2017; 8,000 endoscopy images, 8 classes) among federated clients.

Label skew, as PFLlib: resized to 64x64, not normalised (PFLlib applies ToTensor only),
2 classes per client under ``pat``. Source: the official kvasir-dataset-v2.zip (downloaded
when online), or ``--source`` the zip or its folder ``kvasir-dataset-v2/<class>/*.jpg``
(classes sorted by name). Writes::

    kvasir/train/<i>.npz, kvasir/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    kvasir/config.json

Example::

    python dataset/generate_kvasir.py noniid - pat
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="kvasir", scenario="label skew", modality="image", num_classes=8, input_shape=(3, 64, 64),
               default_model="CNN", clients="20 (partitioned)", raw_name="kvasir-dataset-v2.zip",
               where="https://datasets.simula.no/downloads/kvasir/kvasir-dataset-v2.zip",
               url="https://datasets.simula.no/downloads/kvasir/kvasir-dataset-v2.zip", image_size=64,
               normalize=False)


def load(src, args):
    """Class folders under kvasir-dataset-v2/ (found by its 'polyps' class)."""
    folder = rd.find_dir(src, "polyps")
    if folder is None:
        raise DatasetError(f"no kvasir-dataset-v2/<class>/ folders (such as polyps/) under {src}")
    x, y, classes = rd.image_folder(folder, (3, args.image_size, args.image_size))
    return Loaded(x=x, y=y, class_names=classes, num_classes=len(classes))


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
