"""utils/fileio.py, the one I/O layer: writes confined to their folder (no symlink followed at any
component, exclusive temporary files, atomic rename, removal by name only), reads of regular files only
with their caps, and locks taken over by exactly one of several processes at once."""
import multiprocessing
import os
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from utils import fileio, locks


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "victim.txt").write_text("keep me")
    return d


def test_a_symlink_at_any_component_is_refused_not_followed(tmp_path, outside):
    run = fileio.Folder(tmp_path / "run")
    (run.path / "a").mkdir()
    (run.path / "a" / "b").symlink_to(outside)
    with pytest.raises(fileio.FileIOError, match="is a symlink"):
        run.sub("a/b/c")
    with pytest.raises(fileio.FileIOError, match="is a symlink"):
        run.sub("a/b")
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_a_replaced_file_is_renamed_into_place_and_a_link_there_is_replaced_not_followed(tmp_path, outside):
    run = fileio.Folder(tmp_path / "run")
    (run.path / "r.json").symlink_to(outside / "victim.txt")
    fileio.write_bytes(run, "r.json", b"{}")
    assert (run.path / "r.json").read_bytes() == b"{}" and not (run.path / "r.json").is_symlink()
    assert (outside / "victim.txt").read_text() == "keep me"
    assert sorted(p.name for p in run.path.iterdir()) == ["r.json"]  # no temporary file left


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary_file(tmp_path):
    run = fileio.Folder(tmp_path / "run")
    fileio.write_bytes(run, "r.h5", b"old")

    def full(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(fileio.FileIOError, match=r"\(No space left on device\); the previous complete file is kept"):
        run.replace([("r.h5", full)])
    assert (run.path / "r.h5").read_bytes() == b"old" and sorted(os.listdir(run.path)) == ["r.h5"]


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "a\nb", "x" * 201])
def test_a_name_that_is_not_one_file_name_is_refused(tmp_path, name):
    with pytest.raises(fileio.FileIOError, match="is not a file name"):
        fileio.write_bytes(fileio.Folder(tmp_path), name, b"")


def test_remove_takes_a_name_and_never_a_folder(tmp_path, outside):
    run = fileio.Folder(tmp_path / "run")
    (run.path / "link").symlink_to(outside / "victim.txt")
    assert run.remove("link") and not run.remove("link")  # the link itself, not its target
    (run.path / "d").mkdir()
    with pytest.raises(fileio.FileIOError, match="is a folder"):
        run.remove("d")
    assert (outside / "victim.txt").read_text() == "keep me"


def test_reads_take_regular_files_only_and_quickly(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(fileio.FileIOError, match="a FIFO, not a regular file"):
        fileio.read_bytes(fifo, "x")
    with pytest.raises(fileio.FileIOError, match="a folder, not a regular file"):
        fileio.read_bytes(tmp_path, "x")
    with pytest.raises(fileio.FileIOError, match="a device, not a regular file"):
        fileio.read_bytes("/dev/zero", "x")
    assert time.monotonic() - start < 1
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    with pytest.raises(fileio.FileIOError, match="is a symlink"):
        fileio.read_bytes(tmp_path / "link", "x", follow=False)


def test_a_file_over_its_cap_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(fileio.CONFIG_CAP + 1)  # sparse: nothing to read if the size is checked first
    with pytest.raises(fileio.FileIOError, match=f"more than the {fileio.CONFIG_CAP}"):
        fileio.read_bytes(big, "x", cap=fileio.CONFIG_CAP)


@pytest.mark.parametrize("text", ["[" * 65 + "]" * 65, '{"a": ' * 65 + "1" + "}" * 65])
def test_json_nested_deeper_than_its_cap_is_refused(text):
    with pytest.raises(fileio.FileIOError, match="nested more than 64 levels"):
        fileio.parse_json(text, "x")
    assert fileio.parse_json("[" * 64 + "]" * 64, "x") is not None  # 64 is fine
    assert fileio.parse_json('["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]', "x")  # in a string


@pytest.mark.optional_deps("yaml")
def test_yaml_nested_deeper_than_its_cap_is_refused():
    with pytest.raises(fileio.FileIOError, match="nested more than 64 levels"):
        fileio.parse_yaml("a: " + "[" * 100 + "]" * 100, "x")
    deep = "".join(f"{'  ' * i}k{i}:\n" for i in range(80)) + "  " * 80 + "v: 1\n"
    with pytest.raises(fileio.FileIOError, match="nested more than 64 levels"):
        fileio.parse_yaml(deep, "x")


def test_an_npz_is_checked_from_its_headers_before_an_array_is_read(tmp_path):
    path = tmp_path / "c.npz"
    np.savez(path, x=np.zeros((4, 2), np.uint8), y=np.arange(4))
    assert fileio.read_npz(path, ("x", "y"))["x"].shape == (4, 2)
    with pytest.raises(fileio.FileIOError, match="unpacks to 296 bytes, more than the 100"):
        fileio.read_npz(path, ("x", "y"), cap=100)  # 8 + 32 bytes of data, a 128-byte npy header each
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros(3_000_000, np.uint8))
    with pytest.raises(fileio.FileIOError, match="unpacks to"):
        fileio.read_npz(bomb, ("x",), cap=1_000_000)
    big_endian = tmp_path / "be.npz"
    np.savez(big_endian, x=np.arange(3, dtype=">f4"))
    x = fileio.read_npz(big_endian, ("x",))["x"]
    assert x.dtype.isnative and list(x) == [0.0, 1.0, 2.0]


# ---- locks ---------------------------------------------------------------------------------------------------
def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _contend(path, barrier, results):
    folder = fileio.Folder(path)
    barrier.wait()
    try:
        fd = locks.take_lock(folder, "r.lock")
    except locks.Busy:
        fd = None
    results.put(fd is not None)
    barrier.wait()  # every process has tried before the holder lets go
    if fd is not None:
        locks.release_lock(folder, "r.lock", fd)


@pytest.mark.parametrize("stale", ["dead pid", "no lock at all"])
def test_a_stale_lock_is_taken_over_by_exactly_one_of_many_processes(tmp_path, stale):
    ctx = multiprocessing.get_context("fork")
    pid = dead_pid()
    for trial in range(8):
        if stale == "dead pid":
            (tmp_path / "r.lock").write_text(f"{pid} 1\n")
        barrier, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_contend, args=(tmp_path, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert sum(got) == 1, (trial, got)
        assert not (tmp_path / "r.lock").exists()  # its holder removed it


def test_a_lock_holds_pid_and_start_time_and_refuses_while_its_holder_lives(tmp_path):
    folder = fileio.Folder(tmp_path)
    fd = locks.take_lock(folder, "r.lock")
    pid, start = (tmp_path / "r.lock").read_text().split()
    assert int(pid) == os.getpid() and start == locks.process_start(os.getpid())
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(1), ctx.Queue()
    p = ctx.Process(target=_contend, args=(tmp_path, barrier, results))
    p.start()
    assert results.get(timeout=60) is False
    p.join()
    locks.release_lock(folder, "r.lock", fd)
    assert not (tmp_path / "r.lock").exists()


def test_a_lock_of_a_reused_pid_is_stale(tmp_path):
    (tmp_path / "r.lock").write_text(f"{os.getppid()} 1\n")  # the pid lives, but started at another time
    fd = locks.take_lock(fileio.Folder(tmp_path), "r.lock")
    assert (tmp_path / "r.lock").read_text().split()[0] == str(os.getpid())
    locks.release_lock(fileio.Folder(tmp_path), "r.lock", fd)


# ---- every file through the I/O layer ------------------------------------------------------------------------
RAW = r"\bopen\(|\.read_text\(|\.read_bytes\(|\.write_text\(|\.write_bytes\(|np\.load\(|h5py\.File\(|json\.load\(|" \
      r"torch\.load\(|torch\.save\(|\.unlink\(|\.mkdir\(|rmtree|os\.remove|os\.replace|savefig\("
ALLOWED = {  # (file, what the line holds): why it is not a file of a run's folder or of a user
    ("system/runtime/reaper.py", "/proc/"): "the run's own processes, in /proc",
    ("*", "ast.parse(path.read_text()"): "the library's own source files (what a plug-in or algorithm declares)",
    ("system/runtime/executors.py", "rmtree(self.folder"): "the parked-client folder this run made (mkdtemp)",
    ("system/runtime/parking.py", "rmtree, self.folder"): "the parked-client folder this run made (mkdtemp)",
    ("dataset/utils/dataset_utils.py", "rmtree(made"): "the download folder this generator made, when it failed",
    ("system/utils/results.py", "h5py.File(file"): "a file object the I/O layer opened",
    ("system/runtime/state.py", "torch.load(io.BytesIO"): "bytes the I/O layer read",
    ("system/runtime/state.py", "torch.save(tree, buf)"): "into memory",
}


def test_the_library_and_its_scripts_open_files_only_through_the_io_layer():
    import re

    from conftest import REPO

    files = [p for p in (REPO / "system").rglob("*.py") if p.name not in ("fileio.py", "locks.py")]
    files += [REPO / "scripts" / "run" / n for n in ("table.py", "plot.py", "sweep.py")]
    files += [REPO / "dataset" / "utils" / "dataset_utils.py"]
    raw = []
    for path in files:
        rel = str(path.relative_to(REPO))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(RAW, code) and "fileio." not in code and '"""' not in line and "``" not in line and not any(
                    f in (rel, "*") and s in line for f, s in ALLOWED):
                if re.search(r"lambda f|\(f, |\(file, |\(f\)|replace\(\[", code):  # a file object from fileio
                    continue
                raw.append(f"{rel}:{n}: {line.strip()}")
    assert raw == []
