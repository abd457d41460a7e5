"""Federated Amazon Review (Blitzer et al. 2007; sentiment of product reviews), one product domain per client.

Feature shift, as PFLlib: books, dvd, electronics and kitchen, each one client (or
--clients-per-domain clients); a review is the bag-of-words count vector of its first
--features (5,000) unigram/bigram features, float32; 2 classes (negative, positive).
Source (manual download; the processed form of the MDAN/KD3A papers that PFLlib uses):
``--source`` ``amazon.npz`` (sparse feature-by-review matrix xx_data/xx_row/xx_col/xx_shape,
labels yy in {-1, 1}, domain boundaries offset) or its original ``amazon.mat`` (xx, yy,
offset). Writes::

    AmazonReview/train/<i>.npz, AmazonReview/test/<i>.npz   x float32 [n, 5000], y int64 [n]
    AmazonReview/config.json                               client_groups: the domain of each client

Example::

    python dataset/generate_AmazonReview.py --source amazon.npz
"""

import io
import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils.dataset_utils import DatasetError, fileio, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

DOMAINS = ("books", "dvd", "electronics", "kitchen")
FEATURES = 5000
SPEC = ZooSpec(name="AmazonReview", scenario="feature shift", modality="vector", num_classes=2,
               input_shape=(FEATURES,), default_model="AmazonMLP", clients="4 domains", raw_name="amazon.npz",
               where="https://drive.google.com/u/0/uc?id=1QbXFENNyqor1IlCpRRFtOluI2_hMEd1W (amazon.npz, as PFLlib)")


def _dense(src):
    """(x float32 [reviews, FEATURES], labels in {-1, 1}, offsets) from amazon.npz or amazon.mat."""
    if src.suffix == ".mat":
        from scipy.io import loadmat

        m = loadmat(io.BytesIO(fileio.read_bytes(src, "source file", cap=fileio.SOURCE_CAP)))
        xx = m["xx"].tocsr() if hasattr(m["xx"], "tocsr") else np.asarray(m["xx"])
        yy, offset = np.asarray(m["yy"]).reshape(-1), np.asarray(m["offset"]).reshape(-1)
        if xx.shape[0] != len(yy):
            xx = xx.T
        x = np.asarray(xx[:, :FEATURES].todense() if hasattr(xx, "todense") else xx[:, :FEATURES], dtype=np.float32)
        return x, yy, offset
    # the arrays, read through the I/O layer (headers checked before an array is read, nothing unpickled)
    a = fileio.read_npz(src, ("xx_shape", "xx_row", "xx_col", "xx_data", "yy", "offset"), "source file")
    features, reviews = (int(v) for v in a["xx_shape"])
    x = np.zeros((reviews, FEATURES), dtype=np.float32)
    keep = a["xx_row"] < FEATURES
    np.add.at(x, (a["xx_col"][keep], a["xx_row"][keep]), a["xx_data"][keep])
    return x, a["yy"].reshape(-1), a["offset"].reshape(-1)


def load(src, args):
    """Dense feature vectors; the domain of review i is the offset interval holding i."""
    path = src if src.is_file() else next((p for p in (src / "amazon.npz", src / "amazon.mat") if p.is_file()), None)
    if path is None:
        raise DatasetError(f"no amazon.npz or amazon.mat in {src}")
    try:
        x, yy, offset = _dense(path)
    except (KeyError, ValueError, OSError) as err:
        raise DatasetError(f"{path.name} is not the processed Amazon Review file: {err!r}") from None
    offset = offset.astype(np.int64)
    if len(offset) != len(DOMAINS) + 1 or offset[-1] != len(yy) or len(x) != len(yy):
        raise DatasetError(f"{path.name}: offset must bound {len(DOMAINS)} domains of the {len(yy)} reviews")
    groups = np.repeat(np.arange(len(DOMAINS)), np.diff(offset))
    return Loaded(x=x, y=((yy.astype(np.int64) + 1) // 2), groups=groups, group_names=list(DOMAINS),
                  class_names=["negative", "positive"])


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
