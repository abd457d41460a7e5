"""Federated UCI HAR (Anguita et al. 2013; smartphone inertial signals, 6 activities, 30 subjects).

Real world, as PFLlib: one client per subject (30). A sample is a 2.56 s window of the
nine raw inertial signals (body_acc, body_gyro, total_acc; x, y, z, in that order),
128 steps each, stored as float32 [9, 1, 128] for HARCNN. Train and test are merged and
re-split per subject. Source: the UCI archive (downloaded when online; it nests
"UCI HAR Dataset.zip") or ``--source`` it or the ``UCI HAR Dataset`` folder:
``{train,test}/Inertial Signals/<signal>_<part>.txt`` (one window per line),
``{train,test}/y_<part>.txt`` (1..6), ``{train,test}/subject_<part>.txt`` (1..30),
``activity_labels.txt``. Writes::

    HAR/train/<i>.npz, HAR/test/<i>.npz   x float32 [n, 9, 1, 128], y int64 [n]
    HAR/config.json                      client_groups: the subject of each client

Example::

    python dataset/generate_HAR.py
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

URL = "https://archive.ics.uci.edu/static/public/240/human+activity+recognition+using+smartphones.zip"
SIGNALS = [f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz"]
SPEC = ZooSpec(name="HAR", scenario="real world", modality="series", num_classes=6, input_shape=(9, 1, 128),
               default_model="HARCNN", clients="30 subjects", raw_name="human+activity+recognition+using+smartphones.zip",
               where=URL, url=URL)


def load(src, args):
    """Stack the nine signal files of train and test; subjects are the natural clients."""
    folder = rd.find_dir(src, "train/Inertial Signals/body_acc_x_train.txt")
    if folder is None:
        raise DatasetError(f"no train/Inertial Signals/ under {src}; pass the UCI HAR archive or its folder")
    xs, ys, subjects = [], [], []
    for part in ("train", "test"):
        base = folder / part
        if not base.is_dir():
            continue
        try:
            signals = [np.loadtxt(rd.open_text(base / "Inertial Signals" / f"{s}_{part}.txt"), dtype=np.float32, ndmin=2)
                       for s in SIGNALS]
            ys.append(np.loadtxt(rd.open_text(base / f"y_{part}.txt"), dtype=np.int64, ndmin=1) - 1)
            subjects.append(np.loadtxt(rd.open_text(base / f"subject_{part}.txt"), dtype=np.int64, ndmin=1))
        except (OSError, ValueError) as err:
            raise DatasetError(f"cannot read UCI HAR {part} files: {err}") from None
        xs.append(np.stack(signals, axis=1)[:, :, None, :])
    names = None
    if (folder / "activity_labels.txt").is_file():
        names = [line.split()[1] for line in rd.read_text(folder / "activity_labels.txt").split("\n") if line.strip()]
    groups = np.concatenate(subjects)
    return Loaded(x=np.concatenate(xs), y=np.concatenate(ys), groups=groups,
                  group_names=[f"subject {s}" for s in range(groups.max() + 1)], class_names=names)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
