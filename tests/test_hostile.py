"""An adversarial trial: hostile files and values in every position the library reads or writes, none of
them the cases docs/security.md listed before it. Each case states what must hold: the run (or script)
either works or stops with exactly one line starting with "error:" and exit code 2, never a traceback and
never a hang (each runs under a deadline); nothing outside the run's folders is written, replaced or
deleted (``World.intact``); and where the case is a corruption, that it is refused. docs/security.md gives
the count of cases that broke before the I/O layer and after it."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import main
from cli import parse_config
from conftest import cli

STEM = "Digits_FedAvg_test_0"
SEQ = ("--executor", "sequential")


class Hung(BaseException):
    """Raised by the deadline: the call was still running (a read blocked on a FIFO, a loop that never ends)."""


@contextlib.contextmanager
def deadline(seconds: int):
    def fire(*_):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def snapshot(top: Path, skip: set[str]) -> dict:
    """Every entry under ``top`` but the folders in ``skip``: its kind and, for a file, its bytes."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(top):
        rel = Path(dirpath).relative_to(top)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                seen[str(p.relative_to(top))] = ("link", os.readlink(p))
            elif p.is_file():
                seen[str(p.relative_to(top))] = ("file", p.read_bytes())
            else:
                seen[str(p.relative_to(top))] = ("other", None)
    return seen


class World:
    """A tiny split (``root``), a results folder (``out``), a folder of generated splits (``gen``) and a
    folder of files nobody may touch (``outside``)."""

    def __init__(self, tmp_path: Path, pristine: Path):
        self.tmp = tmp_path
        self.root = tmp_path / "data"
        shutil.copytree(pristine / "data", self.root, symlinks=True)
        self.out = tmp_path / "out"
        if (pristine / "out").exists():
            shutil.copytree(pristine / "out", self.out)
        else:
            self.out.mkdir()
        self.gen = tmp_path / "gen"
        self.gen.mkdir()
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        (self.outside / "victim.txt").write_text("keep me")
        shutil.copy(self.root / "Digits" / "train" / "0.npz", self.outside / "victim.npz")
        self.before = None

    def seal(self):
        self.before = snapshot(self.tmp, {"data", "out", "gen"})

    def intact(self):
        assert self.before is not None
        assert snapshot(self.tmp, {"data", "out", "gen"}) == self.before, "something outside the run's folders changed"

    def fifo(self, path: Path) -> Path:
        if path.is_symlink() or path.exists():
            path.unlink()
        os.mkfifo(path)
        return path

    def call(self, fn, *args, seconds: int = 30):
        """(exit code, stderr lines) of ``fn(*args)``; a SystemExit's code counts as returned."""
        import io

        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), deadline(seconds):
                code = fn(*args)
        except SystemExit as e:
            code = e.code
        return code, err.getvalue().strip().splitlines()

    def run(self, *flags, seconds: int = 30):
        return self.call(main.main, cli(self.root, self.out, "-gr", "1", *SEQ, *flags), seconds=seconds)


def safe(code, err, refused: bool = False, says: str | None = None):
    """Exit 0, or exit 2 with one "error:" line; ``refused``: must be exit 2; ``says``: in that line."""
    assert code in ((2,) if refused else (0, 2)), (code, err)
    assert not [e for e in err if "Traceback" in e], err
    if code == 2:
        assert len(err) == 1 and err[0].startswith("error: "), err
        if says is not None:
            assert says in err[0], err


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A tiny split, and a 2-round run on it with its checkpoint."""
    from dataset import generate_Digits

    top = tmp_path_factory.mktemp("hostile")
    assert generate_Digits.main(["--root", str(top / "data"), "--num-clients", "3", "--partition", "iid",
                                 "--subsample", "150", "--seed", "2"]) == 0
    assert main.main(cli(top / "data", top / "out", "-gr", "2", "--checkpoint_every", "1", *SEQ)) == 0
    return top


@pytest.fixture
def world(tmp_path, pristine):
    return World(tmp_path, pristine)


# ---- checkpoints: a crafted tree with a valid checksum --------------------------------------------------
def resume(w: World, *flags):
    return w.call(main.main, cli(w.root, w.out, "-gr", "3", "--checkpoint_every", "1", "--resume", *SEQ, *flags))


def nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def craft(w: World, edit) -> None:
    from runtime.state import read_file, write_file

    path = w.out / f"{STEM}.ckpt"
    ckpt = read_file(path)
    ckpt = edit(ckpt) or ckpt
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)  # a deeply nested value is pickled recursively
    try:
        write_file(ckpt, path)
    finally:
        sys.setrecursionlimit(limit)


def _set(path: list, value):
    def edit(ckpt):
        node = ckpt
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


KIND = "__state__"
CHECKPOINTS = {  # name -> edit of the checkpoint tree
    "recorder out_dir moved outside": lambda w: _set(["server", "recorder"], {
        KIND: "object", "type": "utils.results.RunRecorder", "attrs": {"out_dir": str(w.outside)}}),
    "recorder meta replaced": lambda w: _set(["server", "recorder"], {
        KIND: "object", "type": "utils.results.RunRecorder", "attrs": {"meta": {"config": "x"}}}),
    "client x_train replaced by other pixels": lambda w: lambda c: c["clients"][0].__setitem__(
        "x_train", torch.zeros(40, 1, 8, 8)),
    "server cfg replaced by a dict": lambda w: _set(["server", "cfg"], {"global_rounds": 99}),
    "a method shadowed by a number": lambda w: _set(["server", "select_clients"], 5),
    "a client's id changed": lambda w: _set(["clients", 0, "id"], 2),
    "round 10**12": lambda w: _set(["round"], 10 ** 12),
    "round True": lambda w: _set(["round"], True),
    "round 0 with 3 evaluations stored": lambda w: _set(["round"], 0),
    "a string in the accuracy series": lambda w: lambda c: c["recorder"]["series"]["rs_test_acc"].__setitem__(0, "x"),
    "series of unequal lengths": lambda w: lambda c: c["recorder"]["series"]["rs_round"].pop(),
    "a value nested 5000 deep": lambda w: _set(["server", "late"], nested(5000)),
    "an empty config": lambda w: _set(["config"], {}),
    "round times replaced by a string": lambda w: lambda c: c["recorder"].__setitem__("round_time", "abc"),
}


@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_a_crafted_checkpoint_is_refused_and_writes_nothing_outside(world, case):
    before = (world.out / f"{STEM}.h5").read_bytes()
    craft(world, CHECKPOINTS[case](world))
    world.seal()
    code, err = resume(world)
    safe(code, err, refused=True, says="checkpoint")
    world.intact()
    assert (world.out / f"{STEM}.h5").read_bytes() == before  # nothing measured is lost


def test_a_checkpoint_that_is_a_fifo_is_refused_quickly(world):
    world.fifo(world.out / f"{STEM}.ckpt")
    world.seal()
    code, err = resume(world)
    safe(code, err, refused=True)
    world.intact()


def test_a_checkpoint_that_is_a_symlink_is_refused(world):
    ckpt = world.out / f"{STEM}.ckpt"
    shutil.move(ckpt, world.outside / "elsewhere.ckpt")
    ckpt.symlink_to(world.outside / "elsewhere.ckpt")
    world.seal()
    code, err = resume(world)
    safe(code, err, refused=True)
    world.intact()


def test_a_checkpoint_path_that_is_a_folder_is_one_line(world):
    (world.out / f"{STEM}.ckpt").unlink()
    (world.out / f"{STEM}.ckpt").mkdir()
    world.seal()
    code, err = world.run("--checkpoint_every", "1")
    safe(code, err, refused=True)
    world.intact()


# ---- parked clients (--client_state disk) -----------------------------------------------------------------
PARK = ("-jr", "0.4", "--client_state", "disk")


def tamper_parked(monkeypatch, how):
    from runtime import parking

    park = parking.ClientStore.park

    def park_then_tamper(self, c):
        park(self, c)
        how(self, c)

    monkeypatch.setattr(parking.ClientStore, "park", park_then_tamper)


def _other(store, c):
    return store.folder / f"{(c.id + 1) % 3}.pt"


@pytest.mark.parametrize("how", ["symlink to another client's file", "another client's file copied",
                                 "a fifo"])
def test_a_tampered_parked_client_is_refused(world, monkeypatch, how):
    def tamper(store, c):
        path = store.path(c)
        if how == "a fifo":
            world.fifo(path)
        elif _other(store, c).exists():
            if how.startswith("symlink"):
                path.unlink()
                path.symlink_to(_other(store, c))
            else:
                shutil.copy(_other(store, c), path)
        else:  # the first parked: a copy of itself under another client's name comes next
            return
    tamper_parked(monkeypatch, tamper)
    world.seal()
    code, err = world.run(*PARK, "-gr", "2", seconds=20)
    safe(code, err, refused=True, says="parked client")
    world.intact()


@pytest.mark.parametrize("kind", ["dangling symlink", "fifo"])
def test_a_client_state_dir_that_is_not_a_folder_is_one_line(world, kind):
    place = world.tmp / "parked"
    if kind == "fifo":
        os.mkfifo(place)
    else:
        place.symlink_to(world.tmp / "nowhere")
    world.seal()
    code, err = world.run(*PARK, "--client_state_dir", str(place))
    safe(code, err, refused=True, says="--client_state_dir")
    world.intact()


# ---- splits -------------------------------------------------------------------------------------------------
def rewrite(w: World, part: str, fn, i: int | None = None):
    for path in sorted((w.root / "Digits" / part).glob("*.npz")):
        if i is not None and path.name != f"{i}.npz":
            continue
        with np.load(path) as f:
            x, y = fn(f["x"], f["y"])
        np.savez(path, x=x, y=y)


def edit_config(w: World, **changes):
    path = w.root / "Digits" / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def big_endian_floats(w):
    edit_config(w, x_dtype="float32", normalize=None)
    for part in ("train", "test"):
        rewrite(w, part, lambda x, y: ((x / 255).astype(">f4"), y))


def header_claims_huge(w):
    path = w.root / "Digits" / "train" / "0.npz"
    import io
    import zipfile

    header = {"descr": "|u1", "fortran_order": False, "shape": (2 ** 40, 1, 8, 8)}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with np.load(path) as f:
        y = f["y"]
    ybuf = io.BytesIO()
    np.save(ybuf, y)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", buf.getvalue() + b"\0" * 64)
        z.writestr("y.npy", ybuf.getvalue())


def npz_symlink_to_fifo(w):
    fifo = w.tmp / "fifo.npz"
    os.mkfifo(fifo)
    target = w.root / "Digits" / "train" / "1.npz"
    target.unlink()
    target.symlink_to(fifo)


def npz_folder(w):
    target = w.root / "Digits" / "test" / "1.npz"
    target.unlink()
    target.mkdir()


SPLITS = {  # name -> (damage, refused)
    "big-endian float32 pixels": (big_endian_floats, False),
    "fortran-ordered pixels": (lambda w: rewrite(w, "train", lambda x, y: (np.asfortranarray(x), y)), False),
    "an npy header claiming 2**40 images": (header_claims_huge, True),
    "a client file linked to a fifo": (npz_symlink_to_fifo, True),
    "a client file that is a folder": (npz_folder, True),
    "vocab_size true on a text split": (lambda w: edit_config(w, modality="text", vocab_size=True), True),
    "input_shape of 40 dimensions": (lambda w: edit_config(w, input_shape=[1] * 40), True),
    "labels stored as uint64 beyond int64": (lambda w: rewrite(w, "train", lambda x, y: (
        x, np.full(len(y), 2 ** 63 + 5, dtype=np.uint64)), i=0), True),
    "config.json in UTF-16": (lambda w: (w.root / "Digits" / "config.json").write_bytes(
        (w.root / "Digits" / "config.json").read_text().encode("utf-16")), False),
    "config.json nested 100000 deep in an unread key": (lambda w: (w.root / "Digits" / "config.json").write_text(
        (w.root / "Digits" / "config.json").read_text().rstrip().rstrip("}") + ', "z": ' + "[" * 100000
        + "]" * 100000 + "}"), True),
}


@pytest.mark.parametrize("case", sorted(SPLITS))
def test_a_hostile_split_is_one_line_or_runs(world, case):
    damage, refused = SPLITS[case]
    damage(world)
    world.seal()
    code, err = world.run(seconds=20)
    safe(code, err, refused=refused)
    world.intact()


# ---- generators -----------------------------------------------------------------------------------------------
def generate(w: World, *flags, out: str = "G"):
    from dataset import generate_Digits
    from dataset.utils.dataset_utils import run_cli

    argv = ["--root", str(w.gen), "--out", out, "--num-clients", "2", "--partition", "iid", "--subsample", "60",
            *flags]
    return w.call(lambda: run_cli(generate_Digits.main, argv))


def test_a_generator_does_not_follow_a_planted_temporary_npz(world):
    (world.gen / "G" / "train").mkdir(parents=True)
    (world.gen / "G" / "train" / ".0.npz.tmp").symlink_to(world.outside / "victim.txt")
    world.seal()
    safe(*generate(world))
    world.intact()


def test_a_generator_does_not_clear_a_linked_test_folder(world):
    safe(*generate(world))
    shutil.rmtree(world.gen / "G" / "test")
    (world.gen / "G" / "test").symlink_to(world.outside)
    world.seal()
    safe(*generate(world, "--seed", "5", "--overwrite"))
    world.intact()


def test_a_generator_does_not_write_through_a_linked_out_folder(world):
    (world.gen / "G").symlink_to(world.outside)
    world.seal()
    safe(*generate(world))
    world.intact()


def test_a_generator_does_not_write_through_a_linked_plot(world):
    safe(*generate(world))
    (world.gen / "G" / "label_distribution.png").symlink_to(world.outside / "victim.txt")
    world.seal()
    safe(*generate(world, "--plot"))
    world.intact()


def test_a_generator_with_config_json_a_folder_is_one_line(world):
    (world.gen / "G").mkdir()
    (world.gen / "G" / "config.json").mkdir()
    world.seal()
    safe(*generate(world))
    world.intact()


# ---- --config ---------------------------------------------------------------------------------------------------
def config_file(w: World, name: str, text: str | bytes) -> Path:
    path = w.tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize("name,text,refused", [
    ("huge.yaml", "local_epochs: 100000000000000000000000\n", True),
    ("nan.json", '{"local_learning_rate": NaN}', True),
    ("newline.json", '{"goal": "a\\nb"}', True),
    ("latin1.json", b'{"goal": "\xff"}', True),
    ("bom.json", "\ufeff{\"goal\": \"x\"}", False),
])
def test_a_hostile_config_file_is_one_line(world, name, text, refused):
    path = config_file(world, name, text)
    world.seal()
    code, err = world.run("--config", str(path))
    safe(code, err, refused=refused)
    world.intact()


def test_a_config_file_that_is_a_symlink_loop_is_one_line(world):
    loop = world.tmp / "loop.json"
    loop.symlink_to(loop)
    world.seal()
    safe(*world.run("--config", str(loop)), refused=True, says="--config")
    world.intact()


# ---- numbers ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [
    ("-gr", str(10 ** 20)), ("--workers", "1000000"), ("--seed", str(2 ** 70)), ("-ls", "1000000000"),
    ("-lr", "1e-320"), ("-algo", "FedProx", "-mu", "1e300"), ("--server_opt", "adam", "--server_tau", "1e-300"),
    ("-algo", "FedALA", "-et", "1e308"),
])
def test_a_number_no_float32_run_can_take_is_refused_up_front(world, flags):
    world.seal()
    assert parse_refused(world, *flags) is not None, flags
    world.intact()


def parse_refused(world, *flags):
    """The one line a parse of these flags stops with (None: accepted)."""
    from utils.errors import FLError

    try:
        with contextlib.redirect_stderr(open(os.devnull, "w")):
            parse_config(cli(world.root, world.out, *SEQ, *flags))
    except FLError as e:
        return str(e)
    except SystemExit:
        return "argparse"
    return None


@pytest.mark.parametrize("flags", [("--aggregator", "krum", "--krum_f", "100"), ("-cdr", "0.999999"),
                                   ("-nc", str(10 ** 30)), ("-lbs", str(10 ** 30))])
def test_an_extreme_number_runs_or_is_one_line(world, flags):
    world.seal()
    safe(*world.run(*flags))
    world.intact()


# ---- the results folder ---------------------------------------------------------------------------------------------
def test_a_lock_that_is_a_fifo_is_one_line_quickly(world):
    world.fifo(world.out / f"{STEM}.lock")
    world.seal()
    safe(*world.run(seconds=15), refused=True)
    world.intact()


def test_a_lock_that_is_a_folder_is_one_line(world):
    (world.out / f"{STEM}.lock").mkdir()
    world.seal()
    safe(*world.run(), refused=True)
    world.intact()


def test_a_lock_linked_outside_is_neither_read_nor_removed(world):
    (world.outside / "victim.txt").write_text(str(os.getppid()))
    (world.out / f"{STEM}.lock").symlink_to(world.outside / "victim.txt")
    world.seal()
    safe(*world.run(), refused=True)
    world.intact()


def test_a_sidecar_that_is_a_fifo_with_resume_is_one_line_quickly(world):
    (world.out / f"{STEM}.ckpt").unlink()
    world.fifo(world.out / f"{STEM}.json")
    world.seal()
    argv = cli(world.root, world.out, "-gr", "2", "--resume", *SEQ)
    argv.remove("--overwrite")
    safe(*world.call(main.main, argv, seconds=15))
    world.intact()


def test_sfn_through_a_linked_intermediate_folder_writes_nothing_outside(world):
    (world.out / "a").symlink_to(world.outside)
    world.seal()
    safe(*world.run("-sfn", "a/b"))
    world.intact()


def test_tensorboard_naming_a_file_is_one_line(world):
    (world.out / "tb").write_text("")
    world.seal()
    safe(*world.run("--tensorboard", "tb"), refused=True)
    world.intact()


def test_tensorboard_through_a_linked_intermediate_folder_writes_nothing_outside(world):
    (world.out / "a").symlink_to(world.outside)
    world.seal()
    safe(*world.run("--tensorboard", "a/tb"))
    world.intact()


def test_a_result_path_that_is_a_folder_is_one_line(world):
    (world.out / f"{STEM}.h5").unlink()
    (world.out / f"{STEM}.h5").mkdir()
    world.seal()
    safe(*world.run(), refused=True)
    world.intact()


def test_a_sidecar_linked_outside_is_replaced_not_followed(world):
    (world.out / f"{STEM}.json").unlink()
    (world.out / f"{STEM}.json").symlink_to(world.outside / "victim.txt")
    world.seal()
    safe(*world.run())
    world.intact()


# ---- reports: table.py, plot.py, get_mean_std.py ---------------------------------------------------------------------
def result(out: Path, stem: str, label: str = "FedAvg", goal: str = "t"):
    from utils.results import RunRecorder

    cfg = {"dataset": "Digits", "algorithm": "FedAvg", "global_rounds": 1, "goal": goal, "seed": 0}
    rec = RunRecorder(stem, {"config": cfg, "run": 0, "seed": 0, "label": label}, out)
    for i, a in enumerate((0.5, 0.6)):
        rec.add(i, {"test_acc": a, "test_auc": 0.7, "train_loss": 1.0, "client_test_acc": [a, a]})
    rec.round_time = [1.0, 1.0]
    rec.save()
    return rec.h5_path


def table_text(w: World, *args):
    import io

    from scripts.run import table

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code, err = w.call(table.main, [str(w.out / "r"), *args])
    return code, err, buf.getvalue()


@pytest.mark.parametrize("label,fmt,forbidden", [
    ("A|B", "md", "A|B"), ("x<script>alert(1)</script>", "md", "<script>"), ("`x`", "md", "`x`"),
    ("@SUM(1+1)", "csv", "\n@SUM"), ("+1+2", "csv", "\n+1+2"), ("-1+2", "csv", "\n-1+2"),
    ("\t=1", "csv", "\n\t=1"),
])
def test_a_label_is_escaped_in_every_report_format(world, label, fmt, forbidden):
    result(world.out / "r", "Digits_X_t_0", label=label)
    result(world.out / "r", "Digits_FedAvg_t_0")
    code, err, text = table_text(world, "--format", fmt)
    safe(code, err)
    assert code == 0 and forbidden not in text, text


def damage_sidecar_null(path):
    path.with_suffix(".json").write_text("null")


def damage_config_string(path):
    path.with_suffix(".json").write_text(json.dumps({"config": "x", "label": "Y"}))


def damage_group(path):
    path.unlink()
    with h5py.File(path, "w") as f:
        f.create_group("rs_test_acc")
        f.create_dataset("rs_round", data=np.arange(2.0))


def damage_round_strings(path):
    path.unlink()
    with h5py.File(path, "w") as f:
        f.create_dataset("rs_test_acc", data=np.array([0.1, 0.2]))
        f.create_dataset("rs_round", data=np.array([b"a", b"b"]))


def damage_h5_fifo(path):
    path.unlink()
    os.mkfifo(path)


def damage_json_fifo(path):
    path.with_suffix(".json").unlink()
    os.mkfifo(path.with_suffix(".json"))


def damage_label_number(path):
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**meta, "label": 5, "status": ["finished"]}))


REPORT_DAMAGE = {"sidecar null": damage_sidecar_null, "config a string": damage_config_string,
                 "series a group": damage_group, "rounds as strings": damage_round_strings,
                 "h5 a fifo": damage_h5_fifo, "sidecar a fifo": damage_json_fifo,
                 "label a number, status a list": damage_label_number}


@pytest.mark.parametrize("case", sorted(REPORT_DAMAGE))
@pytest.mark.parametrize("script", ["table", "plot", "get_mean_std"])
def test_a_malformed_result_is_skipped_by_every_report(world, case, script):
    good = result(world.out / "r", "Digits_FedAvg_t_0")
    bad = result(world.out / "r", "Digits_FedAvg_t_1")
    REPORT_DAMAGE[case](bad)
    import get_mean_std
    from scripts.run import plot
    from scripts.run import table

    entry = {"table": lambda: table.main([str(good.parent)]),
             "plot": lambda: plot.main(["curves", str(good.parent), "--out", str(world.out / "fig")]),
             "get_mean_std": lambda: get_mean_std.main([str(good.parent)])}[script]
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        code, err = world.call(entry, seconds=20)
    assert code == 0, (code, err)
    assert not [e for e in err if "Traceback" in e], err


# ---- sweep files --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [{"tag": 5}, {"out": 5}, {"checkpoint_every": True}, "fifo"])
def test_a_hostile_sweep_file_is_one_line(world, spec):
    from scripts.run import sweep

    path = world.tmp / "sweep.json"
    if spec == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(json.dumps(spec))
    world.seal()
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        code, err = world.call(sweep.main, ["--config", str(path), "--dry-run", "--out", str(world.out / "s")],
                               seconds=15)
    safe(code, err, refused=True)
    world.intact()


def test_a_planted_cpu_record_of_the_wrong_type_does_not_stop_a_sweep(world):
    from scripts.run import sweep

    job = sweep.Job(argv=[], stem="x", out=world.out, gr=1)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    job.log.with_suffix(".cpu.json").write_text("[1, 2]")
    world.seal()
    code, err = world.call(lambda: sweep.add_cpu_seconds(job, 1.5) or 0)
    safe(code, err)
    assert sweep.cpu_seconds(job) == 1.5
    world.intact()
