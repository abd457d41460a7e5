"""Partition Tiny-ImageNet (200 ImageNet classes, 64x64; 100,000 train + 10,000 val images) among clients.

Label skew, as PFLlib: train and val merged (the unlabelled test part is left out),
20 classes per client under ``pat``; the FedALA paper's TINY* runs ResNet-18 on it.
Source: the official tiny-imagenet-200.zip (downloaded when online), or ``--source`` the
zip or the folder it unpacks to (``wnids.txt``, ``words.txt``, ``train/<wnid>/images/*.JPEG``,
``val/images/*.JPEG`` with ``val/val_annotations.txt``: file, wnid, box). Class i is line i of
wnids.txt. Writes::

    TinyImagenet/train/<i>.npz, TinyImagenet/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    TinyImagenet/config.json

Example::

    python dataset/generate_TinyImagenet.py noniid - dir
    python system/main.py -data TinyImagenet -m ResNet18 -algo FedALA
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="TinyImagenet", scenario="label skew", modality="image", num_classes=200,
               input_shape=(3, 64, 64), default_model="ResNet18", clients="20 (partitioned)",
               raw_name="tiny-imagenet-200.zip", where="http://cs231n.stanford.edu/tiny-imagenet-200.zip",
               url="http://cs231n.stanford.edu/tiny-imagenet-200.zip", default_class_per_client=20, image_size=64)


def load(src, args):
    """Train images by wnid folder, val images by val_annotations.txt."""
    folder = rd.find_dir(src, "wnids.txt")
    if folder is None:
        raise DatasetError(f"no wnids.txt under {src}; pass tiny-imagenet-200.zip or the folder it unpacks to")
    wnids = [w.strip() for w in rd.read_text(folder / "wnids.txt").split("\n") if w.strip()]
    index = {w: i for i, w in enumerate(wnids)}
    words = {}
    if (folder / "words.txt").is_file():
        for line in rd.read_text(folder / "words.txt").split("\n"):
            if "\t" in line:
                w, text = line.split("\t", 1)
                words[w] = text.split(",")[0].strip()
    paths, labels = [], []
    for w in wnids:
        files = rd.list_images(folder / "train" / w / "images")
        paths += files
        labels += [index[w]] * len(files)
    annotations = folder / "val" / "val_annotations.txt"
    if annotations.is_file():
        for line in rd.read_text(annotations).split("\n"):
            cells = line.split("\t")
            if len(cells) >= 2 and cells[1] in index:
                paths.append(folder / "val" / "images" / cells[0])
                labels.append(index[cells[1]])
    shape = (3, args.image_size, args.image_size)
    return Loaded(x=rd.read_images(paths, shape), y=np.array(labels, dtype=np.int64),
                  class_names=[words.get(w, w) for w in wnids], num_classes=len(wnids))


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
