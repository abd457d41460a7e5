"""Federated EMNIST as LEAF builds it (Caldas et al. 2018; 62 classes, one client per writer).

Real world: each writer is a client (all writers with at least --least-samples samples;
``--num-clients N`` keeps the N writers with the most samples, PFLlib's top-N with N = 100);
``--partition`` re-partitions the pooled images by label instead. Images are the LEAF
pixels (floats in [0, 1], white background) stored as uint8 round(255 v), one channel
(PFLlib repeats them to three). Source (LEAF's preprocessing, e.g.
``./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`` in leaf/data/femnist): ``--source``
a LEAF json file or a folder of them (all_data/ or train/ + test/; a writer found in several
files is merged): {"users": [...], "user_data": {user: {"x": [[784 floats]], "y": [labels]}}}.
Writes::

    FEMNIST/train/<i>.npz, FEMNIST/test/<i>.npz   x uint8 [n, 1, 28, 28], y int64 [n]
    FEMNIST/config.json                          client_groups: the writer of each client

Example::

    python dataset/generate_FEMNIST.py --num-clients 100 --source leaf/data/femnist/data
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

SPEC = ZooSpec(name="FEMNIST", scenario="real world", modality="image", num_classes=62, input_shape=(1, 28, 28),
               default_model="CNN", clients="writers (3,597 in LEAF)", raw_name="femnist",
               where="LEAF (https://github.com/TalwalkarLab/leaf: data/femnist, ./preprocess.sh -s niid --sf 1.0 "
                     "-k 0 -t sample; pass its data/ folder)")


def load(src, args):
    """Pool every LEAF json's users; a user's samples keep their file order."""
    users, xs, ys = rd.read_leaf(src)
    x = np.round(np.concatenate(xs).reshape(-1, 1, 28, 28) * 255).clip(0, 255).astype(np.uint8)
    groups = np.repeat(np.arange(len(users)), [len(v) for v in ys])
    return Loaded(x=x, y=np.concatenate(ys).astype(np.int64), groups=groups, group_names=users)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
