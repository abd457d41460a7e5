"""Federated Omniglot (Lake et al. 2015; 32,460 handwritten characters of 50 alphabets, 20 drawers).

Real world, as PFLlib: one client per drawer (20), the label is the character's alphabet
(50 classes: the 30 background alphabets, then the 20 evaluation ones, each sorted by
name); binary 105x105 images, not normalised. Source: torchvision's download, or
``--source`` the ``omniglot-py`` folder (``images_{background,evaluation}/<alphabet>/
<character>/<image id>_<drawer>.png``). Writes::

    Omniglot/train/<i>.npz, Omniglot/test/<i>.npz   x uint8 [n, 1, 105, 105], y int64 [n]
    Omniglot/config.json                           client_groups: the drawer of each client

Example::

    python dataset/generate_Omniglot.py
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, fetch_torchvision, generate  # noqa: E402

SPEC = ZooSpec(name="Omniglot", scenario="real world", modality="image", num_classes=50, input_shape=(1, 105, 105),
               default_model="CNN", clients="20 drawers", raw_name="omniglot-py",
               where="https://github.com/brendenlake/omniglot (torchvision downloads it)", fetch="torchvision",
               image_size=105, normalize=False)
PARTS = ("images_background", "images_evaluation")


def load(src, args):
    """Walk both parts: alphabet -> label, the file name's suffix -> drawer (natural client)."""
    folder = rd.find_dir(src, PARTS[0])
    if folder is None and args.download:
        from torchvision import datasets
        fetch_torchvision(SPEC, src, lambda root: [datasets.Omniglot(root, background=b, download=True)
                                                   for b in (True, False)])
        folder = rd.find_dir(src, PARTS[0])
    if folder is None:
        raise DatasetError(f"no {PARTS[0]} under {src}; pass the omniglot-py folder")
    paths, labels, drawers, alphabets = [], [], [], []
    for part in PARTS:
        if not (folder / part).is_dir():
            continue
        for alphabet in sorted(d for d in (folder / part).iterdir() if d.is_dir()):
            alphabets.append(alphabet.name)
            for character in sorted(d for d in alphabet.iterdir() if d.is_dir()):
                for f in rd.list_images(character):
                    paths.append(f)
                    labels.append(len(alphabets) - 1)
                    drawers.append(int(f.stem.rsplit("_", 1)[1]))
    drawers = np.array(drawers, dtype=np.int64)
    names = [f"drawer {d}" for d in range(drawers.max() + 1)]
    shape = (1, args.image_size, args.image_size)
    return Loaded(x=rd.read_images(paths, shape), y=np.array(labels, dtype=np.int64), groups=drawers,
                  group_names=names, class_names=alphabets)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
