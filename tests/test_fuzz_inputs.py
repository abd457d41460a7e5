"""Fuzzing the inputs a user controls: a small valid split is damaged at random (files truncated, bytes
flipped, dtypes, shapes and labels changed, config values replaced, files deleted) and flags get random
values (non-finite numbers, negative seeds, escaping -go / -sfn among them). Every outcome must be a normal
run, or exit code 2 with exactly one line on stderr that starts with "error:"; never a traceback, never a
half-written result file, never a file outside the run's folder. Below, one case per class of bad input
named in README's "When something goes wrong" (splits, paths, generators, archives). Seeded (the cases are the same every time)
and bounded: about 60 one-round runs on 3 tiny clients, a few seconds in all."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest

import main
from conftest import REPO, cli

CASES = 60
FLAG_VALUES = {
    "-gr": ["0", "1", "-1", "x", "1.5"], "-lr": ["0", "-0.1", "nan", "inf", "1e6", "abc", "0.1"],
    "-lbs": ["0", "-2", "1", "1000", "2.5"], "-ls": ["0", "-1", "1", "q"], "-jr": ["0", "1.5", "-1", "0.5", "nan"],
    "-nc": ["0", "-3", "2", "99", "two"], "-eg": ["0", "-1", "1"], "-cdr": ["1", "-0.5", "0.5"],
    "-s": ["0", "101", "50"], "-p": ["-1", "9", "0"], "-m": ["CNN", "DNN", "VGG", "cnn"],
    "-algo": ["FedAvg", "FedALA", "Nope"], "-ncl": ["3", "10", "-1"], "--eval_batch_size": ["0", "1"],
    "-et": ["0", "1", "nan"], "-ldg": ["nan", "-inf", "0.9"], "--seed": ["-1", "3"], "-go": ["x", "../x", "a/b"],
    "-sfn": ["../x", "/tmp/fuzz_abs", "m"],
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
    if key == "normalize":  # non-finite or degenerate constants (json.dumps writes NaN and Infinity)
        junk += [{"mean": [v], "std": [0.5]} for v in (float("nan"), float("inf"))]
        junk += [{"mean": [0.5], "std": [v]} for v in (1e-300, float("inf"), float("nan"))]
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
    assert sorted(p.name for p in tmp_path.iterdir()) in (["data"], ["data", "out"]), context  # nothing elsewhere
    assert not (tmp_path.parent / "x").exists() and not os.path.exists("/tmp/fuzz_abs"), context
    for side in out.glob("*.json") if out.exists() else []:  # every result written is complete
        assert (out / side.name.replace(".json", ".h5")).exists(), context


# ---- one case per class of bad input -------------------------------------------------------------------
def rewrite_clients(root, part, fn):
    for path in sorted((root / "Digits" / part).glob("*.npz")):
        with np.load(path) as f:
            x, y = fn(f["x"], f["y"])
        np.savez(path, x=x, y=y)


def edit_config(root, **changes):
    path = root / "Digits" / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def float_split(root, bad):
    """The split as float32 vectors (no normalisation), one value replaced by ``bad``."""
    edit_config(root, x_dtype="float32", normalize=None)
    for part in ("train", "test"):
        rewrite_clients(root, part, lambda x, y: (x.astype(np.float32) / 255, y))
    path = root / "Digits" / "train" / "0.npz"
    with np.load(path) as f:
        x, y = f["x"].copy(), f["y"]
    x.flat[5] = bad
    np.savez(path, x=x, y=y)


def symlink_loop(root):
    shutil.rmtree(root / "Digits")
    (root / "Digits").symlink_to(root / "Digits")


def no_test_samples(root):
    rewrite_clients(root, "test", lambda x, y: (x[:0], y[:0]))
    edit_config(root, test_samples=[0] * json.loads((root / "Digits" / "config.json").read_text())["num_clients"])


def config_folder(root):
    (root / "Digits" / "config.json").unlink()
    (root / "Digits" / "config.json").mkdir()


BAD = {  # case -> (damage to the split or None, extra flags, what the one line says)
    "nan pixels": (lambda r: float_split(r, np.nan), (), "NaN or infinite values"),
    "inf pixels": (lambda r: float_split(r, np.inf), (), "NaN or infinite values"),
    "float64 x, config uint8": (lambda r: rewrite_clients(r, "train", lambda x, y: (x.astype(np.float64), y)), (),
                                "the config's x_dtype is uint8"),
    "nan mean": (lambda r: edit_config(r, normalize={"mean": [float("nan")], "std": [0.5]}), (), "normalize"),
    "inf std": (lambda r: edit_config(r, normalize={"mean": [0.5], "std": [float("inf")]}), (), "normalize"),
    "std 1e-300": (lambda r: edit_config(r, normalize={"mean": [0.5], "std": [1e-300]}), (), "normalize"),
    "config.json a folder": (config_folder, (), "config.json cannot be read"),
    "symlink loop": (symlink_loop, (), "symlink loop"),
    "every test split empty": (no_test_samples, (), "nothing to evaluate"),
    "-et nan": (None, ("-algo", "FedALA", "-et", "nan"), "expected a finite number, got 'nan'"),
    "-lr inf": (None, ("-lr", "inf"), "expected a finite number, got 'inf'"),
    "-ldg nan": (None, ("-ld", "-ldg", "nan"), "expected a finite number, got 'nan'"),
    "--seed -1": (None, ("--seed", "-1"), "--seed -1 is out of range: it takes [0, 2^31 - 1]"),
    "--gpus_per_worker 0.00005": (None, ("--gpus_per_worker", "0.00005"),
                                  "--gpus_per_worker 5e-05 is out of range: it takes 0, or [0.0001, 1e6] (Ray's least "
                                  "share of a GPU is 0.0001)"),
    "--gpus_per_worker -1": (None, ("--gpus_per_worker", "-1"), "--gpus_per_worker -1 is out of range"),
    "-go ../../x": (None, ("-go", "../../x"), "-go is part of the result file names"),
    "-sfn ../x": (None, ("-sfn", "../x"), "-sfn must be a folder under --results_dir"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_input_is_one_line_before_any_work(case, pristine, tmp_path, capsys):
    damage, flags, expected = BAD[case]
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    if damage is not None:
        damage(root)
    out = tmp_path / "out"
    try:
        code = main.main(cli(root, out, "-gr", "1", "--executor", "sequential", *flags))
    except SystemExit as e:  # a flag argparse refuses
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not out.exists()  # refused before any work: no result file, no lock, no folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"][:1 + out.exists()]


def test_results_dir_that_is_a_file_or_not_writable(pristine, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "below"):
        assert main.main(cli(pristine, out, "-gr", "1")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not a folder" in err[0], err
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only folder (root may write anyway)
    assert main.main(cli(pristine, tmp_path / "ro", "-gr", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not writable" in err[0], err


def test_data_given_with_a_trailing_slash_runs(pristine, tmp_path):
    argv = cli(pristine, tmp_path / "out", "-gr", "0", "--executor", "sequential")
    argv[argv.index("-data") + 1] = "Digits/"
    assert main.main(argv) == 0 and (tmp_path / "out" / "Digits_FedAvg_test_0.h5").exists()


@pytest.mark.parametrize("argv,expected", [(["--bogus"], "unrecognized arguments: --bogus"),
                                           (["--seed", "-1"], "--seed must be >= 0"),
                                           (["--out", "../x"], "--out is a folder name under --root"),
                                           (["--num-clients", "two"], "invalid int value")])
def test_generator_flag_errors_are_one_line(tmp_path, capsys, argv, expected):
    from dataset import generate_Digits

    with pytest.raises(SystemExit) as e:
        generate_Digits.main(["--root", str(tmp_path), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_archives_cut_short_or_too_large_are_refused(tmp_path):
    from dataset.utils import dataset_utils as du
    from dataset.utils.readers import extract

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.bin", b"\0" * 3_000_000)  # 3 MB in about 3 KB
    cut = tmp_path / "cut.zip"
    cut.write_bytes(bomb.read_bytes()[: bomb.stat().st_size // 2])
    with pytest.raises(du.DatasetError, match="not a complete zip archive"):
        extract(cut, tmp_path / "cut")
    with pytest.raises(du.DatasetError, match="times its size"):
        extract(bomb, tmp_path / "bomb")
    assert not (tmp_path / "bomb" / "zeros.bin").exists()
    parser = du.common_parser("x")
    du.check_common(parser, parser.parse_args(["--max-unpack-ratio", "5000"]))  # the flag raises the cap
    try:
        assert (extract(bomb, tmp_path / "bomb") / "zeros.bin").stat().st_size == 3_000_000
    finally:
        du.UNPACK_LIMIT["ratio"] = du.MAX_UNPACK_RATIO


def tar_with(path, member: tarfile.TarInfo, data: bytes = b""):
    with tarfile.open(path, "w") as t:
        t.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def escaping_archive(kind, tmp_path):
    """An archive under ``tmp_path / "src"`` whose one member would land outside the folder it is unpacked
    into, or is not a plain file or folder."""
    src = tmp_path / "src"
    src.mkdir()
    if kind == "zip ..":
        with zipfile.ZipFile(src / "a.zip", "w") as z:
            z.writestr("../../evil", b"x")
        return src / "a.zip"
    member = tarfile.TarInfo({"tar ..": "../../evil", "absolute": str(tmp_path / "evil")}.get(kind, "inner"))
    if kind in ("tar ..", "absolute"):
        member.size = 1
        return tar_with(src / "a.tar", member, b"x")
    if kind == "nested tar ..":  # the inner archive is unpacked too (find_dir), by the same rules
        inner = tar_with(tmp_path / "inner.tar", tarfile.TarInfo("../../../evil"), b"")
        member.size = inner.stat().st_size
        member.name = "inner.tar"
        return tar_with(src / "a.tar", member, inner.read_bytes())
    member.type, member.linkname = {"symlink": (tarfile.SYMTYPE, "../../evil"),
                                    "hardlink": (tarfile.LNKTYPE, str(tmp_path / "evil")),
                                    "fifo": (tarfile.FIFOTYPE, "")}[kind]
    return tar_with(src / "a.tar", member)


@pytest.mark.parametrize("kind", ["zip ..", "tar ..", "absolute", "symlink", "hardlink", "fifo", "nested tar .."])
def test_archive_members_that_would_escape_or_are_not_files_are_refused(tmp_path, kind):
    from dataset.utils import dataset_utils as du
    from dataset.utils.readers import find_dir

    archive = escaping_archive(kind, tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(du.DatasetError, match="outside its folder|may not unpack"):
        find_dir(archive, "marker.txt")
    after = sorted(tmp_path.rglob("*"))
    made = [p for p in after if p not in before]
    assert all(p.is_relative_to(tmp_path / "src") for p in made), made  # nothing outside the archive's folder
    assert not [p for p in made if p.is_symlink() or not (p.is_file() or p.is_dir())], made  # no link, no FIFO
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()


def test_a_cut_archive_given_to_a_generator_is_one_line(tmp_path):
    archive = tmp_path / "kvasir-dataset-v2.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("kvasir-dataset-v2/polyps/0.jpg", os.urandom(4000))
    archive.write_bytes(archive.read_bytes()[:2000])
    done = subprocess.run([sys.executable, str(REPO / "dataset" / "generate_kvasir.py"), "--root",
                           str(tmp_path / "out"), "--source", str(archive)], capture_output=True, text=True, timeout=120)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "not a complete zip archive" in err[0], err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.npz"))
