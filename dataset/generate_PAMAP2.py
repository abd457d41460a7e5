"""Federated PAMAP2 (Reiss & Stricker 2012; body-worn IMUs, 12 protocol activities, 9 subjects).

Real world, as PFLlib: one client per subject (9), Protocol and Optional recordings of a
subject pooled. Channels as PFLlib: the 16 g accelerometer, gyroscope and magnetometer
(x, y, z) of the hand, chest and ankle IMUs (27 channels), missing values set to 0, each
channel scaled by its largest absolute value within the subject; windows of 256 steps
(2.56 s) every 128 steps. Stored as float32 [27, 1, 256] (PFLlib reshapes the same
numbers to [9, 3, 256]). Labels: the 12 protocol activities in PFLlib's order (1-7, 24
as 0, 12, 13, 16, 17 as 8-11); windows of the other activities or the transient 0 are
dropped, and so are windows that span two activities (PFLlib labels them with the
smaller activity id). Source: the UCI archive PAMAP2_Dataset.zip (downloaded when
online), or ``--source`` it or its folder (``Protocol/subject10<k>.dat``,
``Optional/subject10<k>.dat``; 54 space-separated columns per row). Writes::

    PAMAP2/train/<i>.npz, PAMAP2/test/<i>.npz   x float32 [n, 27, 1, 256], y int64 [n]
    PAMAP2/config.json                         client_groups: the subject of each client

Example::

    python dataset/generate_PAMAP2.py
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

URL = "http://archive.ics.uci.edu/ml/machine-learning-databases/00231/PAMAP2_Dataset.zip"
# Column 1 is the activity; per IMU (hand 3-19, chest 20-36, ankle 37-53): acc16 +1..+3, gyro +7..+9, mag +10..+12.
COLUMNS = [c for start in (4, 21, 38) for c in (*range(start, start + 3), *range(start + 6, start + 12))]
ACTIVITIES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 24: 0, 12: 8, 13: 9, 16: 10, 17: 11}
NAMES = ["rope jumping", "lying", "sitting", "standing", "walking", "running", "cycling", "Nordic walking",
         "ascending stairs", "descending stairs", "vacuum cleaning", "ironing"]
WINDOW, STEP = 256, 128
SPEC = ZooSpec(name="PAMAP2", scenario="real world", modality="series", num_classes=12, input_shape=(27, 1, WINDOW),
               default_model="HARCNN", clients="9 subjects", raw_name="PAMAP2_Dataset.zip", where=URL, url=URL)


def windows(data):
    """Windows of one subject's rows [T, 54]: (x [n, 27, 1, 256], labels [n]) of single-activity windows."""
    signals = np.nan_to_num(data[:, COLUMNS], nan=0.0)
    scale = np.abs(signals).max(axis=0)
    signals = signals / np.where(scale > 0, scale, 1)
    activity = data[:, 1].astype(np.int64)
    xs, ys = [], []
    for start in range(0, len(data) - WINDOW + 1, STEP):
        act = activity[start:start + WINDOW]
        if act[0] in ACTIVITIES and (act == act[0]).all():
            xs.append(signals[start:start + WINDOW].T[:, None, :])
            ys.append(ACTIVITIES[act[0]])
    return xs, ys


def load(src, args):
    """Every subject's Protocol (+ Optional) file, windowed."""
    folder = rd.find_dir(src, "Protocol")
    if folder is None:
        raise DatasetError(f"no Protocol/ folder under {src}; pass PAMAP2_Dataset.zip or its folder")
    xs, ys, groups = [], [], []
    for path in sorted((folder / "Protocol").glob("subject*.dat")):
        parts = [path] + ([folder / "Optional" / path.name] if (folder / "Optional" / path.name).is_file() else [])
        try:
            data = np.concatenate([np.loadtxt(rd.open_text(p), dtype=np.float64, ndmin=2) for p in parts])
        except ValueError as err:
            raise DatasetError(f"cannot read {path.name}: {err}") from None
        if data.shape[1] != 54:
            raise DatasetError(f"{path.name} has {data.shape[1]} columns; PAMAP2 rows have 54")
        x, y = windows(data)
        xs += x
        ys += y
        groups += [int(path.stem.removeprefix("subject"))] * len(y)
    if not xs:
        raise DatasetError(f"no complete {WINDOW}-step window of a protocol activity under {folder}")
    groups = np.array(groups, dtype=np.int64)
    return Loaded(x=np.stack(xs).astype(np.float32), y=np.array(ys, dtype=np.int64), groups=groups,
                  group_names=[f"subject {s}" for s in range(groups.max() + 1)], class_names=NAMES)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
