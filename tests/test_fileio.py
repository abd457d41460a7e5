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

from conftest import zip_version_21
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


# ---- archives: a crafted zip or tar unpacks inside its folder or is refused with one line ---------------------
def crafted_zip(path, members):
    """A zip of ``(name, data, unix_mode)`` members, written from their headers as given."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.create_system = 3  # Unix: the high 16 bits of external_attr are the file's mode
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def crafted_tar(path, members):
    """A tar of ``(name, type, data_or_linkname)`` members."""
    import io
    import tarfile

    with tarfile.open(path, "w") as t:
        for name, kind, payload in members:
            m = tarfile.TarInfo(name)
            m.type = kind
            if kind == tarfile.REGTYPE:
                m.size = len(payload)
                t.addfile(m, io.BytesIO(payload))
            else:
                m.linkname = payload
                t.addfile(m)
    return path


def crafted(kind, tmp_path, outside):
    import stat
    import tarfile

    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    reg = stat.S_IFREG | 0o644
    return {
        "zip ..": lambda: crafted_zip(src / "a.zip", [("ok.txt", b"1", reg), ("../outside/evil", b"x", reg)]),
        "zip absolute": lambda: crafted_zip(src / "a.zip", [(str(outside / "evil"), b"x", reg)]),
        "zip symlink": lambda: crafted_zip(src / "a.zip", [("link", str(outside).encode(), stat.S_IFLNK | 0o777)]),
        "zip fifo": lambda: crafted_zip(src / "a.zip", [("pipe", b"", stat.S_IFIFO | 0o644)]),
        "zip bomb by headers": lambda: crafted_zip(src / "a.zip", []),  # replaced below: sizes in the headers
        "tar ..": lambda: crafted_tar(src / "a.tar", [("d/../../outside/evil", tarfile.REGTYPE, b"x")]),
        "tar absolute": lambda: crafted_tar(src / "a.tar", [(str(outside / "evil"), tarfile.REGTYPE, b"x")]),
        "tar symlink": lambda: crafted_tar(src / "a.tar", [("link", tarfile.SYMTYPE, str(outside))]),
        "tar symlink then through it": lambda: crafted_tar(src / "a.tar", [("l", tarfile.SYMTYPE, "."),
                                                                           ("l/evil", tarfile.REGTYPE, b"x")]),
        "tar hardlink": lambda: crafted_tar(src / "a.tar", [("h", tarfile.LNKTYPE, str(outside / "victim.txt"))]),
        "tar device": lambda: crafted_tar(src / "a.tar", [("dev", tarfile.CHRTYPE, "")]),
        "tar control character": lambda: crafted_tar(src / "a.tar", [("a\nb", tarfile.REGTYPE, b"x")]),
    }[kind]()


ESCAPES = {"zip ..": "outside its folder", "zip absolute": "outside its folder", "zip symlink": "a symlink",
           "zip fifo": "a FIFO", "tar ..": "outside its folder", "tar absolute": "outside its folder",
           "tar symlink": "a symlink", "tar symlink then through it": "a symlink", "tar hardlink": "a hard link",
           "tar device": "a device", "tar control character": "not a file name"}


@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_an_archive_member_that_would_escape_or_is_not_a_file_is_refused_with_one_line(tmp_path, outside, kind):
    from dataset.utils import dataset_utils as du
    from dataset.utils.readers import extract

    archive = crafted(kind, tmp_path, outside)
    with pytest.raises(du.DatasetError) as e:
        extract(archive, tmp_path / "dest")
    line = str(e.value)
    assert "\n" not in line and ESCAPES[kind] in line, line
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]  # nothing written outside
    assert (outside / "victim.txt").read_text() == "keep me"
    assert list((tmp_path / "dest").iterdir()) == []  # a refused archive writes nothing


def test_an_archive_bomb_by_its_headers_or_its_member_count_is_refused_before_a_byte_is_written(tmp_path):
    import io
    import tarfile

    z = tmp_path / "big.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("small.txt", b"1")
        f.writestr("zeros.bin", b"\0" * 1_000_000)  # about 1 KB stored: 1,000 times its size
    with pytest.raises(fileio.FileIOError, match="over 200 times its size") as e:
        fileio.extract(z, fileio.Folder(tmp_path / "z"))
    assert "\n" not in str(e.value) and list((tmp_path / "z").iterdir()) == []
    many = tmp_path / "many.tar"
    with tarfile.open(many, "w") as t:
        for i in range(12):
            t.addfile(tarfile.TarInfo(f"e{i}"), io.BytesIO(b""))
    with pytest.raises(fileio.FileIOError, match="more than 10 members"):
        fileio.extract(many, fileio.Folder(tmp_path / "t"), max_members=10)
    assert list((tmp_path / "t").iterdir()) == []
    assert fileio.extract(many, fileio.Folder(tmp_path / "t"), max_members=12) == 12  # 12 empty files
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(f"e{i}" for i in range(12))
    with pytest.raises(fileio.FileIOError, match="or 1000000 bytes"):  # the cap on the total, whatever the ratio
        fileio.extract(z, fileio.Folder(tmp_path / "z"), ratio=1e9, cap=1_000_000)  # 1 + 10^6 bytes: one over
    assert fileio.extract(z, fileio.Folder(tmp_path / "z"), ratio=1e9, cap=1_000_001) == 2


def test_an_archive_unpacks_its_files_and_folders_and_follows_no_symlink_planted_in_its_folder(tmp_path, outside):
    import stat
    import tarfile

    reg = stat.S_IFREG | 0o644
    z = crafted_zip(tmp_path / "a.zip", [("top/", b"", stat.S_IFDIR | 0o755), ("top/x/1.txt", b"one", reg),
                                         ("./top/2.txt", b"two", 0), ("3.txt", b"", reg)])
    dest = fileio.Folder(tmp_path / "dest")
    assert fileio.extract(z, dest) == 3
    assert (dest.path / "top" / "x" / "1.txt").read_bytes() == b"one"
    assert (dest.path / "top" / "2.txt").read_bytes() == b"two" and (dest.path / "3.txt").read_bytes() == b""
    t = crafted_tar(tmp_path / "b.tar", [("sub/evil", tarfile.REGTYPE, b"x")])
    (dest.path / "sub").symlink_to(outside)  # planted in the folder before the archive is unpacked
    with pytest.raises(fileio.FileIOError, match="is a symlink"):
        fileio.extract(t, dest)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    (dest.path / "link.txt").symlink_to(outside / "victim.txt")
    fileio.extract(crafted_tar(tmp_path / "c.tar", [("link.txt", tarfile.REGTYPE, b"new")]), dest)
    assert (outside / "victim.txt").read_text() == "keep me"  # the link was replaced, not followed
    assert (dest.path / "link.txt").read_bytes() == b"new" and not (dest.path / "link.txt").is_symlink()


def test_a_symlink_planted_where_a_generator_unpacks_an_archive_is_refused_not_followed(tmp_path, outside):
    from dataset.utils import dataset_utils as du
    from dataset.utils.readers import find_dir

    src = tmp_path / "src"
    src.mkdir()
    archive = crafted_zip(src / "a.zip", [("marker.txt", b"x", 0)])
    (src / "a_files").symlink_to(outside)  # where find_dir unpacks a.zip
    with pytest.raises(du.DatasetError, match="is a symlink"):
        find_dir(archive, "marker.txt")
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    (src / "a_files").unlink()
    assert find_dir(archive, "marker.txt") == src / "a_files" and (src / "a_files" / "marker.txt").read_bytes() == b"x"


def test_a_zip_whose_header_says_a_version_zipfile_does_not_take_is_one_line(tmp_path):
    z = crafted_zip(tmp_path / "a.zip", [("a.txt", b"x" * 100, 0)])
    z.write_bytes(zip_version_21(z.read_bytes()))
    with pytest.raises(fileio.FileIOError, match=r"^could not unpack a\.zip \(zip file version 21\.0\); is it a "
                                                  r"complete zip or tar archive\?$"):
        fileio.extract(z, fileio.Folder(tmp_path / "d"))


def test_a_cut_or_foreign_archive_is_one_line(tmp_path):
    z = crafted_zip(tmp_path / "a.zip", [("a.txt", os.urandom(3000), 0)])
    z.write_bytes(z.read_bytes()[:1500])
    with pytest.raises(fileio.FileIOError, match="not a complete zip archive"):
        fileio.extract(z, fileio.Folder(tmp_path / "d"))
    (tmp_path / "b.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(fileio.FileIOError, match="could not unpack b.tar") as e:
        fileio.extract(tmp_path / "b.tar", fileio.Folder(tmp_path / "d"))
    assert "\n" not in str(e.value)
    os.mkfifo(tmp_path / "f.tar")
    with pytest.raises(fileio.FileIOError, match="a FIFO"):
        fileio.extract(tmp_path / "f.tar", fileio.Folder(tmp_path / "d"))


# ---- folders the library made: removed only by the layer, only while they are the folder it made -------------
def test_a_private_folder_is_new_mode_0700_and_removed_only_while_it_is_the_one_made(tmp_path, outside):
    a = fileio.make_private(tmp_path / "p", "fl-x-")
    b = fileio.make_private(tmp_path / "p", "fl-x-")
    assert a != b and a.parent == tmp_path / "p" and a.name.startswith("fl-x-")
    assert a.stat().st_mode & 0o777 == 0o700 and fileio.made(a)
    (a / "sub").mkdir()
    (a / "sub" / "f").write_text("x")
    (a / "link").symlink_to(outside)  # a link inside: removed itself, its target kept
    assert fileio.remove_made(a) and not a.exists()
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    hand = tmp_path / "p" / "by-hand"
    hand.mkdir()
    assert not fileio.remove_made(hand) and hand.is_dir()  # not made by the layer: left alone
    b.rename(tmp_path / "moved")  # swapped for a symlink to somewhere else since it was made
    b.symlink_to(outside)
    assert not fileio.remove_made(b) and (outside / "victim.txt").read_text() == "keep me"
    assert (tmp_path / "moved").is_dir()


def test_folders_made_on_the_way_are_recorded_and_existing_ones_are_not(tmp_path):
    (tmp_path / "had").mkdir()
    run = fileio.Folder(tmp_path / "had")
    assert not fileio.made(tmp_path / "had")
    run.sub("new/deeper")
    assert fileio.made(tmp_path / "had" / "new") and fileio.made(tmp_path / "had" / "new" / "deeper")
    fileio.Folder(tmp_path / "x" / "y")
    assert fileio.made(tmp_path / "x") and fileio.remove_made(tmp_path / "x") and not (tmp_path / "x").exists()
    assert not fileio.remove_made(tmp_path / "had") and (tmp_path / "had" / "new").is_dir()


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
# The AST of every module under system/, dataset/ and scripts/ is walked for a call that opens, creates, moves
# or removes a file or folder by its path (open, io.open, os.open, np.load / np.save*, json.load / dump to a
# file, h5py.File, torch.load / save, Path.open / read_text / read_bytes / write_text / write_bytes, tarfile /
# zipfile, PIL's Image.open, pandas' read_*, scipy's loadmat, savefig, mkdir, rmtree, unlink, ...). A call
# given an open file the I/O layer made (a ``with fileio.open_read(...) as f``, a writer handed to
# ``Folder.replace``, an ``io.BytesIO``) opens nothing itself.
import ast  # noqa: E402
from pathlib import Path  # noqa: E402

PATH_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}
MODULE_CALLS = {  # (module, function): index of the file argument (None: never outside the I/O layer)
    ("io", "open"): None, ("os", "open"): None, ("gzip", "open"): 0, ("bz2", "open"): 0, ("lzma", "open"): 0,
    ("np", "load"): 0, ("np", "save"): 0, ("np", "savez"): 0, ("np", "savez_compressed"): 0, ("np", "savetxt"): 0,
    ("np", "loadtxt"): 0, ("np", "genfromtxt"): 0, ("np", "fromfile"): 0, ("np", "memmap"): 0,
    ("json", "load"): 0, ("json", "dump"): 1, ("pickle", "load"): 0, ("pickle", "dump"): 1,
    ("h5py", "File"): 0, ("torch", "load"): 0, ("torch", "save"): 1, ("tarfile", "open"): 0, ("tarfile", "TarFile"): 0,
    ("zipfile", "ZipFile"): None, ("Image", "open"): 0, ("os", "remove"): None, ("os", "unlink"): None,
    ("os", "rmdir"): None, ("os", "mkdir"): None, ("os", "makedirs"): None, ("os", "replace"): None,
    ("os", "rename"): None, ("shutil", "rmtree"): None, ("shutil", "move"): None, ("shutil", "copy"): None,
    ("shutil", "copyfile"): None, ("shutil", "copy2"): None, ("shutil", "copytree"): None,
    ("tempfile", "mkdtemp"): None, ("tempfile", "NamedTemporaryFile"): None, ("tempfile", "TemporaryDirectory"): None,
}
ALIASES = {"numpy": "np", "pd": "pandas"}
NAME_CALLS = {"open": None, "loadmat": 0}
METHOD_CALLS = {"savefig": 0, "unlink": None, "mkdir": None, "rmdir": None}
ROUTED = ("fileio", "rd", "readers")  # modules whose read_text/read_bytes go through the I/O layer
WRITERS = ("replace", "save_files", "buffer")  # calls that hand a writer an open file


def dotted(n):
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        d = dotted(n.value)
        return f"{d}.{n.attr}" if d else None
    return None


class Scan(ast.NodeVisitor):
    def __init__(self):
        self.stack, self.found = [], []
        self.writer_defs, self.writer_lambdas = set(), set()
        self.cache = {}

    def prepare(self, tree):
        for node in ast.walk(tree):
            name = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else (
                node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None)
            if name in WRITERS:
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Lambda):
                        self.writer_lambdas.add(id(sub))
                    elif isinstance(sub, ast.Name):
                        self.writer_defs.add(sub.id)

    def file_objects(self) -> set[str]:
        """Names in scope that hold an open file, not a path."""
        names = set()
        for frame in self.stack:
            if id(frame) not in self.cache:
                self.cache[id(frame)] = self.frame_files(frame)
            names |= self.cache[id(frame)]
        return names

    def frame_files(self, frame) -> set[str]:
        names = set()
        if isinstance(frame, ast.Lambda) and id(frame) in self.writer_lambdas:
            names |= {a.arg for a in frame.args.args}
        elif isinstance(frame, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if frame.name in self.writer_defs:
                names |= {a.arg for a in frame.args.args}
            for sub in ast.walk(frame):
                if isinstance(sub, ast.withitem) and isinstance(sub.optional_vars, ast.Name) and is_file_call(
                        sub.context_expr):
                    names.add(sub.optional_vars.id)
                if isinstance(sub, ast.Assign) and is_file_call(sub.value):
                    names |= {t.id for t in sub.targets if isinstance(t, ast.Name)}
        return names

    def generic_visit(self, node):
        scoped = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if scoped:
            self.stack.append(node)
        if isinstance(node, ast.Call):
            self.check(node)
        super().generic_visit(node)
        if scoped:
            self.stack.pop()

    def check(self, node):
        f = node.func
        index, what = "none", None
        if isinstance(f, ast.Name) and f.id in NAME_CALLS:
            index, what = NAME_CALLS[f.id], f.id
        elif isinstance(f, ast.Attribute):
            base = dotted(f.value) or ""
            last = ALIASES.get(base.split(".")[-1], base.split(".")[-1])
            if f.attr in PATH_METHODS and not any(r in base.split(".") for r in ROUTED) and "folder" not in base.lower():
                index, what = None, f".{f.attr}"
            elif (last, f.attr) in MODULE_CALLS:
                index, what = MODULE_CALLS[(last, f.attr)], f"{last}.{f.attr}"
            elif last == "pandas" and f.attr.startswith("read_"):
                index, what = 0, f"pandas.{f.attr}"
            elif f.attr == "open" and last not in ("webbrowser",) and not base.endswith("fileio"):
                index, what = 0 if last in ("Image", "tarfile") else None, f"{base}.open"
            elif f.attr in METHOD_CALLS and last not in ("os",):
                index, what = METHOD_CALLS[f.attr], f".{f.attr}"
        if what is None:
            return
        if index is not None:
            arg = node.args[index] if len(node.args) > index else next(
                (k.value for k in node.keywords if k.arg in ("file", "fileobj", "f", "fname", "fid")), None)
            if arg is not None and (is_file_call(arg) or (isinstance(arg, ast.Name) and arg.id in self.file_objects())):
                return
        self.found.append((node.lineno, what))


def is_file_call(e) -> bool:
    """An expression that makes an open file or an in-memory one, not a path."""
    if not isinstance(e, ast.Call):
        return False
    name = dotted(e.func) or ""
    return (name in ("io.BytesIO", "io.StringIO") or "fileio." in name or name.split(".")[-1] in (
        "open_read", "open_text", "open_append", "open_member"))


def raw_opens(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    s = Scan()
    s.prepare(tree)
    s.visit(tree)
    return s.found



IO_LAYER = {  # file: why it may open files itself
    "system/utils/fileio.py": "the I/O layer",
    "system/utils/locks.py": "the I/O layer's lock files, opened by descriptor inside a Folder without following a link",
    "system/runtime/reaper.py": "/proc of the run's own processes, read by a watcher started as a file that imports "
                                "nothing of the library",
    "scripts/dev/mutate.py": "a development tool that copies, mutates and tests the repository itself",
}
# Not yet through the I/O layer, by file: how many raw calls each holds. Empty: every file the library and its
# scripts open goes through the layer; an entry may only be added with a reason and only go down.
NOT_YET: dict[str, int] = {}


def raw_calls(repo) -> dict[str, list[str]]:
    out = {}
    for root in ("system", "dataset", "scripts"):
        for path in sorted((repo / root).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            if rel in IO_LAYER:
                continue
            found = raw_opens(path)
            if found:
                out[rel] = [f"{rel}:{line}: {what}" for line, what in found]
    return out


def test_the_library_and_its_scripts_open_files_only_through_the_io_layer():
    from conftest import REPO

    found = raw_calls(REPO)
    new = [c for rel, calls in found.items() if len(calls) > NOT_YET.get(rel, 0) for c in calls]
    assert new == [], "open these through utils/fileio.py"
    assert {rel: len(calls) for rel, calls in found.items()} == NOT_YET, "routed: lower NOT_YET's count"


@pytest.mark.parametrize("code", ["open(p)", "Path(p).read_text()", "np.load(p)", "json.dump(v, open(p, 'w'))",
                                  "h5py.File(p, 'r')", "torch.save(s, p)", "zipfile.ZipFile(p)", "Image.open(p)",
                                  "pd.read_csv(p)", "shutil.rmtree(p)", "os.open(p, 0)", "tarfile.open(p)"])
def test_a_planted_raw_open_is_found(tmp_path, code):
    (tmp_path / "m.py").write_text(f"def f(p, v, s):\n    return {code}\n")
    assert raw_opens(tmp_path / "m.py"), code


def test_a_zip_is_opened_in_one_place(tmp_path):
    """zipfile.ZipFile, even on a file the layer opened, only in ``fileio.open_zip``: the one place whose
    errors cover every way zipfile fails on a damaged or foreign zip (the scan finds it anywhere else)."""
    from conftest import REPO

    tree = ast.parse((REPO / "system/utils/fileio.py").read_text())
    where = [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
             for c in ast.walk(f) if isinstance(c, ast.Call) and dotted(c.func) == "zipfile.ZipFile"]
    assert where == ["open_zip"]
    (tmp_path / "m.py").write_text("def f(p):\n    with fileio.open_read(p) as f:\n"
                                   "        return zipfile.ZipFile(f).namelist()\n")
    assert raw_opens(tmp_path / "m.py") == [(3, "zipfile.ZipFile")]


def test_a_file_the_io_layer_opened_is_not_a_raw_open(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f(folder, p, s):\n"
        "    with fileio.open_read(p) as f:\n        h5py.File(f, 'r')\n"
        "    buf = io.BytesIO()\n    torch.save(s, buf)\n"
        "    folder.replace([('x', lambda f: np.savez(f, x=s))])\n"
        "    return torch.load(io.BytesIO(fileio.read_bytes(p)))\n")
    assert raw_opens(tmp_path / "m.py") == []
