"""Partition scikit-learn's bundled digits (1,797 8x8 images, 10 classes) among federated clients.

The embedded default dataset: it ships with scikit-learn, so it works offline on
any machine and is small enough for quick tests. Pixel values 0..16 are scaled to
uint8 as round(v * 255 / 16). Writes, next to this file (or under ``--root``)::

    Digits/train/<i>.npz, Digits/test/<i>.npz   x uint8 [n, 1, 8, 8], y int64 [n]
    Digits/config.json                          every parameter, data checksum, per-client stats

With ~90 samples per client (20 clients), the default least_samples is capped at a
quarter of the mean client size instead of PFLlib's half, so Dirichlet splits
succeed in a few draws. Examples::

    python dataset/generate_Digits.py                    # 20 clients, pathological, 2 classes each
    python dataset/generate_Digits.py noniid - dir       # Dir(0.1)

Expected summary of the first example (seed 1)::

    client  train   test      0     1     2     3     4     5     6     7     8     9
         0     81     27      0     0     0     0     0    50     0    58     0     0
         1     56     18      0    40     0     0     0     0     0     0    34     0
         2     64     22     73     0     0     0     0     0     0    13     0     0
       ...
    total: 20 clients, 1797 samples (train 1346, test 451); client size min 38 max 120
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils.dataset_utils import ImageSpec, generate_images, run_cli  # noqa: E402

SPEC = ImageSpec(name="Digits", num_classes=10, image_shape=(1, 8, 8), class_names=tuple(str(d) for d in range(10)),
                 least_share=0.25)


def load_default(raw_dir):
    """Load the bundled digits as uint8 [N, 8, 8]; raw_dir is unused (nothing to download)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.round(digits.images * 255 / 16).astype(np.uint8)
    return x, digits.target.astype(np.int64), "sklearn", SPEC.class_names


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate_images(SPEC, argv, load_default)


if __name__ == "__main__":
    sys.exit(run_cli(main))
