"""Partition Country211 (Radford et al. 2021; 63,300 geo-located images, 211 countries) among federated clients.

Label skew, as PFLlib: train, valid and test merged, resized to 64x64, 20 classes per client
under ``pat``. Source: torchvision's download, or ``--source`` the ``country211`` folder
(``{train,valid,test}/<country code>/*.jpg``; classes are the sorted country codes). Writes::

    Country211/train/<i>.npz, Country211/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    Country211/config.json

Example::

    python dataset/generate_Country211.py noniid - dir
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401


from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, fetch_torchvision, generate  # noqa: E402

SPEC = ZooSpec(name="Country211", scenario="label skew", modality="image", num_classes=211,
               input_shape=(3, 64, 64), default_model="CNN", clients="20 (partitioned)", raw_name="country211",
               where="https://openaipublic.azureedge.net/clip/data/country211.tgz (torchvision downloads it)",
               fetch="torchvision", default_class_per_client=20, image_size=64)


def load(src, args):
    """Every split's class folders; one class list (the union of country codes, sorted)."""
    folder = rd.find_dir(src, "train")
    if folder is None and args.download:
        from torchvision import datasets
        fetch_torchvision(SPEC, src, lambda root: datasets.Country211(root, download=True))
        folder = rd.find_dir(src, "train")
    if folder is None:
        raise DatasetError(f"no train/ folder under {src}; pass the country211 folder")
    splits = [folder / s for s in ("train", "valid", "test") if (folder / s).is_dir()]
    x, y, classes = rd.image_folder(splits, (3, args.image_size, args.image_size))
    return Loaded(x=x, y=y, class_names=classes, num_classes=len(classes))


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
