"""Fuzzing the inputs a user controls: a small valid split is damaged at random (files truncated, bytes
flipped, dtypes, shapes and labels changed, config values replaced, files deleted) and flags get random
values. Every outcome must be a normal run, or exit code 2 with exactly one line on stderr that starts with
"error:"; never a traceback, never a half-written result file. Seeded (the cases are the same every time)
and bounded: about 60 one-round runs on 3 tiny clients, a few seconds in all."""
import json
import shutil

import numpy as np
import pytest

import main
from conftest import cli

CASES = 60
FLAG_VALUES = {
    "-gr": ["0", "1", "-1", "x", "1.5"], "-lr": ["0", "-0.1", "nan", "inf", "1e6", "abc", "0.1"],
    "-lbs": ["0", "-2", "1", "1000", "2.5"], "-ls": ["0", "-1", "1", "q"], "-jr": ["0", "1.5", "-1", "0.5", "nan"],
    "-nc": ["0", "-3", "2", "99", "two"], "-eg": ["0", "-1", "1"], "-cdr": ["1", "-0.5", "0.5"],
    "-s": ["0", "101", "50"], "-p": ["-1", "9", "0"], "-et": ["0", "1"], "-m": ["CNN", "DNN", "VGG", "cnn"],
    "-algo": ["FedAvg", "FedALA", "Nope"], "-ncl": ["3", "10", "-1"], "--eval_batch_size": ["0", "1"],
}


def mutate_file(rng, root):
    files = sorted((root / "Digits").rglob("*.npz"))
    path = files[rng.integers(len(files))]
    kind = rng.choice(["truncate", "flip", "dtype", "shape", "label", "delete", "count"])
    if kind in ("truncate", "flip", "delete"):
        blob = bytearray(path.read_bytes())
        if kind == "delete":
            path.unlink()
        elif kind == "truncate":
            path.write_bytes(bytes(blob[: rng.integers(len(blob))]))
        else:
            for i in rng.integers(len(blob), size=8):
                blob[i] ^= 0xFF
            path.write_bytes(bytes(blob))
        return f"{kind} {path.name}"
    with np.load(path) as f:
        x, y = f["x"], f["y"]
    if kind == "dtype":
        x = x.astype(rng.choice(["int16", "float16", "bool", "float64"]))
    elif kind == "shape":
        x = x.reshape(len(x), -1) if rng.random() < 0.5 else x[:, :, :4]
    elif kind == "label":
        y = y.copy()
        y[rng.integers(len(y))] = rng.integers(-5, 20)
    else:
        y = y[: rng.integers(len(y) + 1)]
        x = x[: len(y)]
    np.savez(path, x=x, y=y)
    return f"{kind} {path.name}"


def mutate_config(rng, root):
    path = root / "Digits" / "config.json"
    if rng.random() < 0.15:
        path.write_text(path.read_text()[: rng.integers(40)])
        return "truncated config"
    cfg = json.loads(path.read_text())
    key = rng.choice(["num_clients", "num_classes", "input_shape", "train_samples", "test_samples", "normalize",
                      "format_version"])
    junk = [None, "x", -1, 0, 2.5, [], [1, 2], {"a": 1}, 10 ** 9, True]
    if rng.random() < 0.2:
        cfg.pop(key, None)
    else:
        cfg[key] = junk[rng.integers(len(junk))]
    path.write_text(json.dumps(cfg))
    return f"config {key}"


def random_flags(rng):
    names = rng.choice(sorted(FLAG_VALUES), size=rng.integers(1, 4), replace=False)
    flags = []
    for n in names:
        flags += [str(n), str(rng.choice(FLAG_VALUES[n]))]
    return flags


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    from dataset import generate_Digits

    root = tmp_path_factory.mktemp("fuzz_pristine")
    assert generate_Digits.main(["--root", str(root), "--num-clients", "3", "--partition", "iid", "--subsample",
                                 "150", "--seed", "2"]) == 0
    return root


@pytest.mark.parametrize("case", range(CASES))
def test_every_outcome_is_a_run_or_one_line(case, pristine, tmp_path, capsys):
    rng = np.random.default_rng(case)
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    what = []
    kind = case % 3  # damaged files, damaged config, or random flags on a good split
    if kind == 0:
        what.append(mutate_file(rng, root))
    elif kind == 1:
        what.append(mutate_config(rng, root))
    flags = random_flags(rng) if kind == 2 or rng.random() < 0.3 else []
    out = tmp_path / "out"
    try:
        code = main.main(cli(root, out, "-gr", "1", "--executor", "sequential", *flags))
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    context = (what, flags, err)
    assert code in (0, 2), context
    if code == 2:
        assert len(err) == 1 and err[0].startswith("error: "), context
    else:
        assert not [e for e in err if "Traceback" in e], context
    assert not list(out.glob("*.tmp")) if out.exists() else True
    for side in out.glob("*.json") if out.exists() else []:  # every result written is complete
        assert (out / side.name.replace(".json", ".h5")).exists(), context
