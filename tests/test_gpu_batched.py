"""scripts/experiments/gpu_batched.py's pieces that run without a GPU: PFLlib's file format of a split, and the
budget that skips the steps which no longer fit (the whole script's dry run is
``DEV=cpu bash scripts/experiments/gpu_batched.sh``)."""
import argparse

import numpy as np

from scripts.experiments import gpu_batched
from utils.data_utils import load_split


def test_the_split_in_pfllibs_format(digits_tiny_root, tmp_path):
    args = argparse.Namespace(root=digits_tiny_root, pfllib=tmp_path / "pfllib" / "system")
    target = gpu_batched.write_pfllib_split(args, "Digits")
    data = load_split("Digits", digits_tiny_root, None, "cpu")
    assert target == tmp_path / "pfllib" / "dataset" / "Digits"
    for i, c in enumerate(data.clients):
        for part, x, y in (("train", c.x_train, c.y_train), ("test", c.x_test, c.y_test)):
            with open(target / part / f"{i}.npz", "rb") as f:  # as PFLlib's read_data opens it
                got = np.load(f, allow_pickle=True)["data"].tolist()
            assert got["x"].dtype == np.float32 and got["x"].shape == tuple(x.shape)
            assert np.allclose(got["x"], x.numpy() * 2 - 1) and np.array_equal(got["y"], y.numpy())


def test_a_step_that_does_not_fit_is_skipped_and_a_failing_one_reported():
    report = {"skipped": [], "errors": []}
    clock = gpu_batched.Clock(10.0)
    assert gpu_batched.step(report, clock, "long", 60, lambda: 1) is None
    assert report["skipped"] and report["skipped"][0].startswith("long (needs about 60 s")
    assert gpu_batched.step(report, clock, "ok", 1, lambda: 7) == 7

    def boom():
        raise ValueError("no")

    assert gpu_batched.step(report, clock, "bad", 1, boom) is None
    assert report["errors"][0]["step"] == "bad" and "ValueError: no" in report["errors"][0]["error"]
