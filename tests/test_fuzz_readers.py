"""Property-based fuzzing of every reader and of the command line (Hypothesis): valid files with one field
mutated, cut short, bytes flipped, nested deeply, values of the wrong type or huge, and FIFOs, symlinks and
folders in every path position of a run. Each property: the reader returns, or refuses with the library's
one-line error (``FLError``: exit code 2 from the command line), never another exception, and nothing
outside the run's folders is written or removed.

The suite runs a fixed, derandomized budget per reader (the ``n`` of each ``budget(n)``: about 30 s on one
core). ``FUZZ_SCALE=K`` runs K times each budget (docs/security.md gives a longer run)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import main
from cli import parse_config
from conftest import cli, zip_version_21
from test_hostile import SEQ, STEM, World, safe, snapshot
from utils import fileio
from utils.errors import FLError

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))


def budget(n: int):
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=12)
           | st.sampled_from([0, -1, 1, 10 ** 9, 10 ** 30, 1e-300, 1e308, "", "../x", "a\nb", "\0"]))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=8)


def deep(depth: int):
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


values_or_deep = values | st.integers(60, 3000).map(deep)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    from dataset import generate_Digits

    top = tmp_path_factory.mktemp("fuzz")
    assert generate_Digits.main(["--root", str(top / "data"), "--num-clients", "3", "--partition", "iid",
                                 "--subsample", "150", "--seed", "2"]) == 0
    assert main.main(cli(top / "data", top / "out", "-gr", "1", "--checkpoint_every", "1", *SEQ)) == 0
    return top


# ---- text: JSON and YAML ------------------------------------------------------------------------------------------
@budget(300)
@given(st.text(max_size=200) | st.binary(max_size=200) | st.integers(1, 5000).map(lambda d: "[" * d + "]" * d))
def test_json_reader(data):
    with contextlib.suppress(fileio.FileIOError):
        fileio.parse_json(data, "x")


@pytest.mark.optional_deps("yaml")
@budget(200)
@given(st.text(max_size=200) | st.integers(1, 3000).map(lambda d: "a: " + "[" * d + "]" * d))
def test_yaml_reader(text):
    with contextlib.suppress(fileio.FileIOError):
        fileio.parse_yaml(text, "x")


# ---- a split's config.json and client files --------------------------------------------------------------------------
@budget(150)
@given(key=st.sampled_from(["num_clients", "num_classes", "input_shape", "train_samples", "test_samples", "normalize",
                            "format_version", "modality", "vocab_size", "x_dtype", "label_counts", "extra"]),
       value=values_or_deep, drop=st.booleans())
def test_split_config_reader(pristine, key, value, drop):
    from utils.data_utils import read_config

    config = json.loads((pristine / "data" / "Digits" / "config.json").read_text())
    if drop:
        config.pop(key, None)
    else:
        config[key] = value
    with tempfile.TemporaryDirectory() as d:
        with open(Path(d) / "config.json", "w") as f:
            try:
                f.write(json.dumps(config))
            except (RecursionError, ValueError):
                return
        with contextlib.suppress(FLError):
            read_config("Digits", Path(d))


def npz_readers(path: Path) -> None:
    """Every reader of an npz the library has, on ``path``: each returns or raises its one-line error."""
    from dataset.utils import zoo
    from dataset.utils.dataset_utils import DatasetError, load_source_npz

    with contextlib.suppress(fileio.FileIOError):
        fileio.npz_names(path, "client file")
    with contextlib.suppress(fileio.FileIOError):
        fileio.read_npz(path, ("x", "y"))
    assert zoo.is_plain_npz(path) in (True, False)
    with contextlib.suppress(DatasetError):
        load_source_npz(path)
    with contextlib.suppress(DatasetError):
        zoo.load_npz(path, SimpleNamespace(name="X", scenario="feature skew", modality="image"))


@budget(150)
@given(how=st.sampled_from(["cut", "flip", "arrays", "version"]), at=st.floats(0, 1), n=st.integers(1, 16),
       dtype=st.sampled_from(["u1", "i8", ">f4", "<f8", "?", "U3", "c8", "V4"]),
       shape=st.lists(st.integers(0, 5), max_size=5))
@example(how="flip", at=0.95, n=2, dtype="u1", shape=[])  # found: a header flipped to "zip file version 21.0"
def test_npz_readers(pristine, how, at, n, dtype, shape):
    blob = bytearray((pristine / "data" / "Digits" / "train" / "0.npz").read_bytes())
    if how == "cut":
        del blob[int(at * len(blob)):]
    elif how == "flip":
        for i in range(n):
            blob[int((at + i / 97) % 1 * (len(blob) - 1))] ^= 0xFF
    elif how == "version":
        blob = zip_version_21(bytes(blob))
    else:
        buf = io.BytesIO()
        np.savez(buf, x=np.zeros(shape, dtype=dtype), y=np.arange(n))
        blob = bytearray(buf.getvalue())
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "c.npz").write_bytes(bytes(blob))
        npz_readers(Path(d) / "c.npz")


@pytest.mark.parametrize("reader, line", [
    (lambda p: fileio.read_npz(p, ("x", "y")), r"^file .*c\.npz is not an npz \(zip file version 21\.0\)$"),
    (lambda p: fileio.npz_names(p, "--source"), r"^--source .*c\.npz is not an npz \(zip file version 21\.0\)$"),
])
def test_an_npz_whose_zip_says_a_version_zipfile_does_not_take_is_one_line(tmp_path, reader, line):
    buf = io.BytesIO()
    np.savez(buf, x=np.zeros(2), y=np.arange(2))
    (tmp_path / "c.npz").write_bytes(zip_version_21(buf.getvalue()))
    with pytest.raises(fileio.FileIOError, match=line):
        reader(tmp_path / "c.npz")


def test_a_source_npz_whose_zip_says_a_version_zipfile_does_not_take_is_one_line(tmp_path):
    from dataset.utils import zoo
    from dataset.utils.dataset_utils import DatasetError, load_source_npz

    buf = io.BytesIO()
    np.savez(buf, x=np.zeros((2, 1), np.uint8), y=np.arange(2), groups=np.arange(2))
    (tmp_path / "c.npz").write_bytes(zip_version_21(buf.getvalue()))
    with pytest.raises(DatasetError, match=r"c\.npz is not an npz \(zip file version 21\.0\)$"):
        load_source_npz(tmp_path / "c.npz")
    assert zoo.is_plain_npz(tmp_path / "c.npz") is False


# ---- result files -----------------------------------------------------------------------------------------------
@budget(100)
@given(how=st.sampled_from(["cut", "flip", "series", "sidecar"]), at=st.floats(0, 1),
       dtype=st.sampled_from(["f8", "i4", "S2", "u1", "c8"]), shape=st.lists(st.integers(0, 3), max_size=3),
       key=st.sampled_from(["rs_test_acc", "rs_round", "config", "label", "status", "run"]), value=values_or_deep)
def test_result_readers(pristine, how, at, dtype, shape, key, value):
    from utils.results import check_series, read_h5, read_sidecar

    with tempfile.TemporaryDirectory() as d:
        h5, side = Path(d) / "r.h5", Path(d) / "r.json"
        shutil.copy(pristine / "out" / f"{STEM}.h5", h5)
        shutil.copy(pristine / "out" / f"{STEM}.json", side)
        if how in ("cut", "flip"):
            blob = bytearray(h5.read_bytes())
            if how == "cut":
                del blob[int(at * len(blob)):]
            else:
                blob[int(at * (len(blob) - 1))] ^= 0xFF
            h5.write_bytes(bytes(blob))
        elif how == "series":
            with h5py.File(h5, "a") as f:
                del f[key if key.startswith("rs_") else "rs_test_acc"]
                f.create_dataset(key if key.startswith("rs_") else "rs_test_acc", data=np.zeros(shape, dtype=dtype))
        else:
            meta = json.loads(side.read_text())
            meta[key] = value
            try:
                side.write_text(json.dumps(meta))
            except (RecursionError, ValueError):
                return
        with contextlib.suppress(FLError):
            check_series(read_h5(h5), h5)
        with contextlib.suppress(FLError):
            read_sidecar(side)


# ---- checkpoints: one node of a real checkpoint replaced ---------------------------------------------------------
def paths_in(tree, prefix=()):
    """Every (path, node) of a saved tree, tensors and plain values included."""
    yield prefix, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from paths_in(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from paths_in(v, (*prefix, i))


@budget(25)
@given(pick=st.floats(0, 1, exclude_max=True), value=values_or_deep | st.sampled_from(
    [torch.zeros(2, 2), torch.tensor(float("nan")), {"__state__": "link", "key": "recorder"},
     {"__state__": "object", "type": "utils.results.RunRecorder", "attrs": {"stem": "../../x"}}]))
def test_checkpoint_reader(pristine, pick, value):
    from runtime import state

    with tempfile.TemporaryDirectory() as d:
        w = World(Path(d), pristine)
        path = w.out / f"{STEM}.ckpt"
        tree = state.read_file(path)
        nodes = [p for p, _ in paths_in(tree) if p]
        where = nodes[int(pick * len(nodes))]
        parent = tree
        for k in where[:-1]:
            parent = parent[k]
        parent[where[-1]] = value
        try:
            state.write_file(tree, path)
        except (RecursionError, state.StateError, TypeError, ValueError):
            return
        w.seal()
        argv = cli(w.root, w.out, "-gr", "2", "--checkpoint_every", "1", "--resume", *SEQ)
        safe(*w.call(main.main, argv))
        w.intact()


# ---- --config, flags and sweep files ------------------------------------------------------------------------------
def flag_names():
    import cli as cli_module

    return sorted(a.dest for a in cli_module.base_parser().flags if a.option_strings)


@budget(100)
@given(data=st.data())
def test_config_file_and_numeric_flags(pristine, data):
    from utils import bounds

    keys = data.draw(st.lists(st.sampled_from(flag_names()), max_size=3))
    config = {k: data.draw(values) for k in keys}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / data.draw(st.sampled_from(["c.json", "c.yaml"]))
        try:
            text = json.dumps(config)
        except (ValueError, RecursionError):
            return
        path.write_text(text)
        argv = cli(pristine / "data", Path(d) / "out", "--config", str(path), *SEQ)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                cfg = parse_config(argv)
        except FLError:
            return
        except SystemExit as e:
            assert e.code == 2
            return
    import cli as cli_module

    actions = bounds.numeric_actions(cli_module.base_parser())
    bounds.check(cfg, actions)  # whatever was accepted is within the table


@budget(150)
@given(spec=values_or_deep | st.dictionaries(st.sampled_from(["base", "grids", "seeds", "tag", "out", "checkpoint_every",
                                                               "per_algorithm", "export"]), values, max_size=3))
def test_sweep_file_reader(spec):
    import sys
    from scripts.run import sweep

    with tempfile.TemporaryDirectory() as d:
        try:
            (Path(d) / "s.json").write_text(json.dumps(spec))
        except (ValueError, RecursionError):
            return
        with contextlib.suppress(sweep.SweepError):
            sweep.load_config_file(Path(d) / "s.json")


# ---- archives: generated members unpack inside their folder or are refused with one line ------------------------
# mostly names and kinds that unpack, so that both outcomes are common (repeats weight the draw)
KINDS = ("file",) * 5 + ("dir",) * 2 + ("symlink", "hardlink", "fifo", "device")
COMPONENTS = ("a", "b", "c.txt", "x y", "é") * 4 + ("..", ".", "", "a\nb", "d\\e", "n" * 201)
member_names = (st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=4).map("/".join)
                | st.sampled_from(["/abs", "/", "../../outside/evil", ""]))
members = st.lists(st.tuples(member_names, st.sampled_from(KINDS), st.integers(0, 3000)), min_size=1, max_size=6)


def build_archive(path: Path, fmt: str, entries) -> None:
    import stat
    import tarfile
    import warnings
    import zipfile

    if fmt == "zip":
        with warnings.catch_warnings(), zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            warnings.simplefilter("ignore")  # a name given twice: zipfile says so, and keeps both
            for name, kind, size in entries:
                info = zipfile.ZipInfo(name + ("/" if kind == "dir" and not name.endswith("/") else ""))
                info.create_system = 3
                mode = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK, "hardlink": stat.S_IFREG,
                        "fifo": stat.S_IFIFO, "device": stat.S_IFCHR}[kind]
                info.external_attr = mode << 16
                z.writestr(info, b"" if kind == "dir" else (b"z" * size if kind != "symlink" else b"../outside"))
        return
    with tarfile.open(path, "w:gz" if fmt == "tar.gz" else "w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, size in entries:
            m = tarfile.TarInfo(name)
            m.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                      "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "device": tarfile.CHRTYPE}[kind]
            if kind == "file":
                m.size = size
                t.addfile(m, io.BytesIO(b"t" * size))
            else:
                m.linkname = "../outside/victim.txt" if kind in ("symlink", "hardlink") else ""
                t.addfile(m)


@budget(150)
@given(fmt=st.sampled_from(["zip", "tar", "tar.gz"]), entries=members, ratio=st.sampled_from([0.5, 5.0, 200.0]),
       max_members=st.integers(1, 8), planted=st.booleans())
def test_archive_extractor(fmt, entries, ratio, max_members, planted):
    """Generated member names, kinds and sizes: the archive unpacks its files inside the target folder (each
    with its bytes), or is refused with one line; nothing outside the target is written or removed, and no
    link, FIFO or device appears inside it."""
    with tempfile.TemporaryDirectory() as d:
        top = Path(d)
        (top / "outside").mkdir()
        (top / "outside" / "victim.txt").write_text("keep me")
        target = top / "run" / "target"
        target.mkdir(parents=True)
        if planted:  # a symlink planted in the target before it is unpacked into
            (target / "a").symlink_to(top / "outside")
        path = top / f"a.{fmt}"
        try:
            build_archive(path, fmt, entries)
        except (ValueError, UnicodeEncodeError):  # a name the archive format itself cannot hold
            return
        before = snapshot(top, {"run"})
        try:
            written = fileio.extract(path, fileio.Folder(target, create=False), "archive", ratio=ratio,
                                     max_members=max_members)
        except fileio.FileIOError as e:
            assert "\n" not in str(e) and str(e), str(e)
            written = None
        event("unpacked" if written is not None else "refused")
        assert snapshot(top, {"run"}) == before  # nothing outside the target written, replaced or removed
        assert sorted(os.listdir(top / "run")) == ["target"]
        for dirpath, dirnames, filenames in os.walk(target):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                assert p == target / "a" and planted or not p.is_symlink(), p
                assert p.is_symlink() or p.is_file() or p.is_dir(), p  # no FIFO, no device
        if written is not None:  # accepted: every member, as the standard library reads the archive back, a
            files = {}           # plain file or folder with a name inside the target, each file with its bytes
            for name, kind, data in stored(path, fmt):
                parts = [c for c in name.split("/") if c not in ("", ".")]
                assert kind in ("file", "dir"), (name, kind)
                assert ".." not in parts and not name.startswith("/"), name
                if kind == "file":
                    files["/".join(parts)] = data
            assert written == sum(1 for _, kind, _ in stored(path, fmt) if kind == "file")
            for rel, data in files.items():
                assert (target / rel).read_bytes() == data, rel


def stored(path: Path, fmt: str) -> list[tuple[str, str, bytes]]:
    """(name, kind, bytes) of every member as Python's zipfile / tarfile read the archive back."""
    import stat
    import tarfile
    import zipfile

    if fmt == "zip":
        with zipfile.ZipFile(path) as z:
            out = []
            for i in z.infolist():
                mode = stat.S_IFMT(i.external_attr >> 16)
                kind = ("dir" if i.filename.endswith("/") else "file" if mode in (0, stat.S_IFREG) else "other")
                out.append((i.filename, kind, z.read(i) if kind == "file" else b""))
            return out
    with tarfile.open(path) as t:
        return [(m.name, "file" if m.isreg() else "dir" if m.isdir() else "other",
                 t.extractfile(m).read() if m.isreg() else b"") for m in t.getmembers()]


# ---- the command line: a FIFO, a symlink or a folder in every path position ----------------------------------------------
POSITIONS = {  # where -> (path inside the world, extra flags)
    "checkpoint": (lambda w: w.out / f"{STEM}.ckpt", ("--resume", "--checkpoint_every", "1")),
    "result h5": (lambda w: w.out / f"{STEM}.h5", ()),
    "sidecar": (lambda w: w.out / f"{STEM}.json", ("--resume",)),
    "lock": (lambda w: w.out / f"{STEM}.lock", ()),
    "split config": (lambda w: w.root / "Digits" / "config.json", ()),
    "client file": (lambda w: w.root / "Digits" / "test" / "2.npz", ()),
    "--config": (lambda w: w.tmp / "c.json", ("--config", "{path}")),
    "-sfn folder": (lambda w: w.out / "m", ("-sfn", "m")),
    "--tensorboard folder": (lambda w: w.out / "tb", ("--tensorboard", "tb/x")),
    "--client_state_dir": (lambda w: w.tmp / "parked", ("--client_state", "disk", "--client_state_dir", "{path}")),
}


def plant(w: World, path: Path, kind: str) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink to a file outside":
        path.symlink_to(w.outside / "victim.txt")
    elif kind == "symlink to a folder outside":
        path.symlink_to(w.outside)
    else:
        path.symlink_to(w.tmp / "nowhere")


@budget(12)
@given(where=st.sampled_from(sorted(POSITIONS)),
       kind=st.sampled_from(["fifo", "folder", "symlink to a file outside", "symlink to a folder outside", "dangling"]))
def test_every_path_position(pristine, where, kind):
    with tempfile.TemporaryDirectory() as d:
        w = World(Path(d), pristine)
        path_of, flags = POSITIONS[where]
        path = path_of(w)
        plant(w, path, kind)
        w.seal()
        argv = cli(w.root, w.out, "-gr", "1", *SEQ, *(f.format(path=path) for f in flags))
        safe(*w.call(main.main, argv, seconds=60))
        w.intact()
        assert snapshot(w.outside, set()) == {"victim.txt": ("file", b"keep me"),
                                               "victim.npz": ("file", (pristine / "data" / "Digits" / "train" /
                                                                       "0.npz").read_bytes())}
