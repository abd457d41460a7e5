"""The one I/O layer: the library and its scripts open the files they read and write through here.

Reads (``open_read``, ``read_bytes``, ``read_json``, ``read_yaml``, ``read_npz``) take regular files only: a
path is opened with ``O_NONBLOCK`` (a FIFO or a device does not block the open) and then checked with
``fstat`` before a byte is read; ``follow=False`` (the library's own files inside a run's folder) refuses a
symlink at the last component too (``O_NOFOLLOW``). Every read is capped: the file's size, a JSON or YAML
document's nesting depth, an npz's uncompressed size from its zip headers and each array's size from its
npy header, before any array is read.

Writes go through a ``Folder``: a directory opened once as a file descriptor. Every path inside it is
opened relative to that descriptor, one component at a time with ``O_NOFOLLOW``, so a symlink planted
anywhere inside the folder is refused, never followed. A file is written to a temporary name created
exclusively (``O_EXCL``) beside its target and renamed into place within the folder (atomic). A folder
removes only what its caller names (entries the library itself created and recorded), never by glob.
``write_file`` and ``write_figure`` do the same for the scripts' outputs.

Folders: every folder the layer makes (``Folder``, ``Folder.sub``, and ``make_private``: a new folder of the
run's own, created exclusively with mode 0700) is recorded with its device and inode; ``remove_made`` removes
a folder's tree only where this process made it and it is still that folder, relative to descriptors and
without following a link inside it. Writers from other packages (TensorBoard, torchvision, Ray) are given
such folders.

Archives (``extract``): every member's header is checked before a byte is written (names inside the target,
regular files and folders only, member count and total size capped), then each file is written through the
target ``Folder``.

Every failure is an ``FLError``: one line, exit code 2 (docs/security.md).
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import secrets
import stat
import zipfile
from pathlib import Path
from typing import Callable, Iterable

try:
    from utils.errors import FLError
except ImportError:  # loaded by the dataset generators, where ``utils`` is dataset/utils (dataset_utils.fileio)
    class FLError(RuntimeError):
        """A user-facing error: one line, exit code 2."""

MiB = 1 << 20
JSON_CAP = 64 * MiB  # a split's config.json, a sidecar, a sweep file, an export
CONFIG_CAP = 1 * MiB  # --config, --client_models
STATE_CAP = 64 << 30  # a checkpoint or a parked client (tensors of every client)
NPZ_CAP = 16 << 30  # the uncompressed bytes of one npz
MAX_DEPTH = 64  # nesting of a JSON / YAML document or of a saved state's containers
NAME_MAX = 200  # a file name the library makes (a result stem plus its suffixes stays under 255 bytes)


class FileIOError(FLError):
    """A file that cannot be read or written as asked: one line naming it."""


def why(e: BaseException) -> str:
    """The reason of an OSError (its strerror), else the first line of its message."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


# ---- reads -----------------------------------------------------------------------------------------------
def _open_fd(path, what: str, cap: int, follow: bool, dir_fd: int | None = None) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise FileIOError(f"{what} {path} is a symlink; the library reads its own files only as regular "
                              f"files") from None
        if e.errno == errno.ENOENT:
            raise FileIOError(f"{what} {path} does not exist") from None
        raise FileIOError(f"{what} {path} cannot be read ({why(e)})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileIOError(f"{what} {path} cannot be read: it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > cap:
            raise FileIOError(f"{what} {path} is {st.st_size} bytes, more than the {cap} this reader takes")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def open_read(path, what: str = "file", cap: int = JSON_CAP, follow: bool = True, dir_fd: int | None = None):
    """A regular file opened for reading in binary (``cap``: its largest size)."""
    fd = _open_fd(path, what, cap, follow, dir_fd)
    with os.fdopen(fd, "rb") as f:
        yield f


def read_bytes(path, what: str = "file", cap: int = JSON_CAP, follow: bool = True, dir_fd: int | None = None) -> bytes:
    with open_read(path, what, cap, follow, dir_fd) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(size + 1)  # a regular file's size, checked against cap when it was opened
    if len(data) > cap:  # grew while it was read
        raise FileIOError(f"{what} {path} is more than the {cap} bytes this reader takes")
    return data


SOURCE_CAP = 16 << 30  # a dataset's own file given to a generator (a CSV, a listing, a text file)
PROC_CAP = 1 << 20  # a file of /proc (its size reads as 0: read to its end, up to this)


def read_text(path, what: str = "file", cap: int = JSON_CAP, encoding: str = "utf-8", follow: bool = True) -> str:
    """A regular file's text (``cap``: its largest size in bytes), decoded as ``encoding``."""
    data = read_bytes(path, what, cap, follow)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise FileIOError(f"{what} {path} is not {encoding} text ({why(e)})") from None


def read_proc(path) -> bytes:
    """A file of /proc about a process (its stat, cmdline, children): a regular file whose size reads as 0,
    read to its end up to ``PROC_CAP``. An OSError where the process is gone."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        chunks, size = [], 0
        while size <= PROC_CAP:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)[:PROC_CAP]
    finally:
        os.close(fd)


def depth(value, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of lists, tuples and dicts in ``value`` (iterative: no recursion on hostile input),
    counted up to ``limit + 1``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
            if isinstance(v, dict):
                stack.extend((k, d + 1) for k in v if isinstance(k, tuple))
    return deepest


def _scan_depth(text: str, quotes: str = '"') -> int:
    """The deepest bracket nesting of a JSON or flow-style YAML text, outside strings (before parsing it:
    the parsers recurse)."""
    deepest = level = 0
    quote = None
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in quotes:
            quote = ch
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def parse_json(data: bytes | str, what: str, limit: int = MAX_DEPTH):
    """A JSON document, nested at most ``limit`` deep (NaN and Infinity are read as Python reads them)."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        try:
            text = data.decode("utf-16") if data[:2] in (b"\xff\xfe", b"\xfe\xff") else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            raise FileIOError(f"{what} is not UTF-8 text") from None
    if _scan_depth(text) > limit:
        raise FileIOError(f"{what} is nested more than {limit} levels deep")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise FileIOError(f"{what} is not valid JSON ({why(e)})") from None
    if depth(value, limit) > limit:
        raise FileIOError(f"{what} is nested more than {limit} levels deep")
    return value


def read_json(path, what: str = "file", cap: int = JSON_CAP, limit: int = MAX_DEPTH, follow: bool = True,
              dir_fd: int | None = None):
    return parse_json(read_bytes(path, what, cap, follow, dir_fd), f"{what} {path}", limit)


def parse_yaml(text: str, what: str, limit: int = MAX_DEPTH):
    """A YAML document with PyYAML's safe loader (plain values only), nested at most ``limit`` deep; an
    alias repeated to blow up its size is refused by the size of what it makes."""
    import yaml

    if _scan_depth(text, "\"'") > limit:
        raise FileIOError(f"{what} is nested more than {limit} levels deep")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FileIOError(f"{what} is not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise FileIOError(f"{what} is nested more than {limit} levels deep") from None
    if depth(value, limit) > limit:
        raise FileIOError(f"{what} is nested more than {limit} levels deep")
    return value


# What zipfile raises on a damaged or foreign zip header: BadZipFile, or NotImplementedError for a version or
# compression it does not take (a flipped byte reads "zip file version 21.0").
ZIP_DAMAGED = (zipfile.BadZipFile, NotImplementedError)
UNPACK_RATIO = 200.0  # an npz unpacks to at most this many times its own size (np.savez stores: about 1)


def open_zip(f, error: Callable[[str], str]) -> zipfile.ZipFile:
    """The one place a zip is opened (a test holds every other module to it): the zip directory of the open
    file ``f``; any way zipfile fails on a damaged, cut or foreign one is one FileIOError, ``error(why)``."""
    try:
        return zipfile.ZipFile(f)
    except (*ZIP_DAMAGED, OSError, ValueError, EOFError) as e:
        raise FileIOError(error(why(e))) from None


def _open_npz(f, what: str, path) -> zipfile.ZipFile:
    return open_zip(f, lambda w: f"{what} {path} is not an npz ({w})")


def npz_names(path, what: str = "file", cap: int = NPZ_CAP, follow: bool = True) -> list[str]:
    """The arrays an npz holds (its ``.npy`` members, without the suffix), from its zip directory alone."""
    with open_read(path, what, cap=cap, follow=follow) as f, _open_npz(f, what, path) as z:
        return [n.removesuffix(".npy") for n in z.namelist() if n.endswith(".npy")]


def read_npz(path, names: Iterable[str], what: str = "file", cap: int = NPZ_CAP, follow: bool = True,
             ratio: float = UNPACK_RATIO) -> dict:
    """The arrays ``names`` of an npz, read without unpickling: the zip's headers (the uncompressed size of
    every member asked for, at most ``cap`` in all and ``ratio`` times the file's size) and each array's npy header (its declared size within
    what the member holds) are checked before any array is read. Arrays come back in native byte order."""
    import numpy as np

    out = {}
    with open_read(path, what, cap=max(cap, NPZ_CAP), follow=follow) as f:
        with _open_npz(f, what, path) as z:
            members = {i.filename: i for i in z.infolist()}
            infos = {}
            for name in names:
                info = members.get(f"{name}.npy")
                if info is None:
                    raise FileIOError(f"{what} {path} lacks the array '{name}' (holds {', '.join(sorted(members))[:80]})")
                infos[name] = info
            total = sum(i.file_size for i in infos.values())
            cap = min(cap, max(int(ratio * os.fstat(f.fileno()).st_size), MiB))
            if total > cap:
                raise FileIOError(f"{what} {path} unpacks to {total} bytes, more than the {cap} this reader takes")
            for name, info in infos.items():
                try:
                    with z.open(info) as member:
                        version = np.lib.format.read_magic(member)
                        header = {(1, 0): np.lib.format.read_array_header_1_0,
                                  (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                        if header is None:
                            raise FileIOError(f"{what} {path}: '{name}' is in npy format {version}, which this "
                                              f"reader does not take")
                        shape, fortran, dtype = header(member)
                        if dtype.hasobject:
                            raise FileIOError(f"{what} {path}: '{name}' holds Python objects (pickles are not read)")
                        size = math.prod(shape) * dtype.itemsize
                        if size > info.file_size:
                            raise FileIOError(f"{what} {path}: '{name}' declares {size} bytes of data, its member "
                                              f"holds {info.file_size}")
                    with z.open(info) as member:
                        arr = np.lib.format.read_array(member, allow_pickle=False)
                except FileIOError:
                    raise
                except (ValueError, OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, TypeError,
                        KeyError, MemoryError, NotImplementedError) as e:
                    raise FileIOError(f"{what} {path}: '{name}' cannot be read ({type(e).__name__}: {why(e)})") from None
                if not arr.dtype.isnative:
                    arr = arr.astype(arr.dtype.newbyteorder("="))
                out[name] = arr
    return out


# ---- writes ------------------------------------------------------------------------------------------------
def check_name(name: str, what: str) -> str:
    """A single file or folder name the library makes: no separator, NUL or control character, not
    ``.``/``..``, at most ``NAME_MAX`` characters."""
    if (not name or name in (".", "..") or any(c in name for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in name)
            or len(name.encode("utf-8", "surrogateescape")) > NAME_MAX):
        raise FileIOError(f"{what}: '{name[:60]}' is not a file name the library can write (one name, no / \\ or "
                          f"control characters, at most {NAME_MAX} bytes)")
    return name


def relative_parts(rel, what: str) -> list[str]:
    """The components of a relative folder name inside a run's folder (no absolute path, no '..')."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise FileIOError(f"{what} must be a folder under --results_dir, a relative name without '..' (got '{rel}')")
    return [check_name(c, what) for c in p.parts]


class Folder:
    """A folder the library writes in, held open as a directory file descriptor. ``Folder(path)`` makes
    ``path`` (and its parents) where missing; the path up to it is the user's to choose. Everything inside
    is reached relative to the descriptor, one component at a time, without following a symlink."""

    def __init__(self, path, create: bool = True, what: str = "--results_dir", _fd: int | None = None):
        self.path, self.what = Path(path), what
        if _fd is not None:
            self.fd = _fd
            return
        try:
            made = None
            if create:
                made = outermost_missing(self.path)
                self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if made is not None:
                _record(made)
        except OSError as e:
            raise FileIOError(f"{what} {self.path} is not a folder the run can use ({why(e)})") from None

    def __del__(self):
        fd = getattr(self, "fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
            self.fd = None

    def __getstate__(self):  # sent to a worker: it reopens the folder by its path
        return {"path": self.path, "what": self.what}

    def __setstate__(self, s):
        self.__init__(s["path"], create=False, what=s["what"])

    def sub(self, rel, create: bool = True, what: str | None = None) -> "Folder":
        """The folder ``rel`` inside this one (made where missing), every component a real folder: a symlink,
        a file or a FIFO on the way is refused with one line."""
        what = what or self.what
        return self._walk(relative_parts(rel, what), create, what)

    def _walk(self, parts: list[str], create: bool, what: str) -> "Folder":
        fd = os.dup(self.fd)
        path = self.path
        try:
            for part in parts:
                path = path / part
                if create:
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                        _record(path, os.stat(part, dir_fd=fd, follow_symlinks=False))
                    except FileExistsError:
                        pass
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise FileIOError(f"{what}: {path} is {self._lkind(part, fd)}; the library writes only into "
                                          f"real folders inside {self.path}") from None
                    raise FileIOError(f"{what}: cannot open {path} ({why(e)})") from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return Folder(path, what=what, _fd=fd)

    @staticmethod
    def _lkind(name: str, fd: int) -> str:
        try:
            return _kind(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError as e:
            return f"unusable ({why(e)})"

    def entry(self, name: str) -> os.stat_result | None:
        """What is at ``name`` (a symlink itself, not its target), None when nothing is."""
        try:
            return os.stat(check_name(name, self.what), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise FileIOError(f"cannot look at {self.path / name} ({why(e)})") from None

    def is_file(self, name: str) -> bool:
        st = self.entry(name)
        return st is not None and stat.S_ISREG(st.st_mode)

    def read_bytes(self, name: str, what: str = "file", cap: int = JSON_CAP) -> bytes:
        """A file of this folder that the library wrote itself: a regular file, never a symlink."""
        return read_bytes(check_name(name, what), what, cap, follow=False, dir_fd=self.fd)

    def read_json(self, name: str, what: str = "file", cap: int = JSON_CAP):
        return parse_json(self.read_bytes(name, what, cap), f"{what} {self.path / name}")

    def replace(self, writes: list[tuple[str, Callable]]) -> None:
        """Write each ``(name, write(file))`` to a new temporary file ``<name>.<random>.tmp`` (created
        exclusively, no symlink followed), then rename them all into place: a failed write (a full disk)
        leaves every previous file as it was and no temporary file behind, and the files of one save are
        replaced together. A folder or another non-file where a target goes is refused."""
        tmps: list[str] = []
        try:
            for name, write in writes:
                check_name(name, self.what)
                st = self.entry(name)
                if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    raise FileIOError(f"{self.path / name} is {_kind(st.st_mode)}; remove it or choose another "
                                      f"{self.what}")
                tmps.append(self._exclusive_tmp(name))
                with os.fdopen(os.open(tmps[-1], os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd),
                               "wb") as f:
                    write(f)
        except FileIOError:
            self._drop(tmps)
            raise
        except (OSError, RuntimeError, ValueError) as e:  # torch.save reports a full disk as a RuntimeError
            self._drop(tmps)
            first = writes[0][0]
            kept = "; the previous complete file is kept" if self.entry(first) is not None else ""
            raise FileIOError(f"could not write {self.path / first} ({why(e)}){kept}") from None
        for tmp, (name, _) in zip(tmps, writes):
            try:
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except OSError as e:
                self._drop(tmps)
                raise FileIOError(f"could not put {self.path / name} in place ({why(e)})") from None

    def _exclusive_tmp(self, name: str) -> str:
        """A new empty file ``<name>.<random>.tmp`` (an OSError where the folder takes no new file: read-only,
        full, gone)."""
        for _ in range(100):
            tmp = f"{name}.{secrets.token_hex(4)}.tmp"
            try:
                os.close(_new_file(tmp, self.fd))
                return tmp
            except FileExistsError:
                continue
        raise FileIOError(f"no free temporary name beside {self.path / name}")

    def _drop(self, names: list[str]) -> None:
        for n in names:
            with contextlib.suppress(OSError):
                os.unlink(n, dir_fd=self.fd)

    def rewrite_in_place(self, name: str, data: bytes) -> None:
        """Overwrite the regular file ``name`` (never through a symlink) with ``data`` where it lies, for a
        folder that takes no new file (made read-only while a run writes): the one write that is not a
        rename, so it takes only data no longer than the file (no new block is needed) and is used only for
        a small file whose previous content is no longer true (a sidecar that says 'running')."""
        try:
            fd = os.open(check_name(name, self.what), os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except OSError as e:
            raise FileIOError(f"cannot rewrite {self.path / name} ({why(e)})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileIOError(f"{self.path / name} is {_kind(st.st_mode)}, not a regular file")
            if len(data) > st.st_size:
                raise FileIOError(f"cannot rewrite {self.path / name} where it lies: {len(data)} bytes do not fit "
                                  f"its {st.st_size}")
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        except OSError as e:
            raise FileIOError(f"cannot rewrite {self.path / name} ({why(e)})") from None
        finally:
            os.close(fd)

    def open_append(self, name: str):
        """The regular file ``name`` opened for appending (created where missing; never through a symlink)."""
        try:
            fd = os.open(check_name(name, self.what), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                         os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=self.fd)
        except OSError as e:
            raise FileIOError(f"cannot append to {self.path / name} ({why(e)})") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise FileIOError(f"{self.path / name} is {_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a")

    def remove(self, name: str) -> bool:
        """Remove the file ``name`` (one the caller created and recorded; a symlink is removed itself,
        never followed; a folder is refused). Returns whether there was one."""
        st = self.entry(name)
        if st is None:
            return False
        if stat.S_ISDIR(st.st_mode):
            raise FileIOError(f"{self.path / name} is a folder where the library keeps a file; remove it by hand")
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise FileIOError(f"could not remove {self.path / name} ({why(e)})") from None
        return True


def _new_file(name: str, dir_fd: int) -> int:
    """Create the file ``name`` in the folder ``dir_fd``, exclusively and without following a symlink: the
    seam every new file of the library goes through (tests make a folder read-only here when they run as
    root, where a chmod does not stop a write)."""
    return os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)


def write_bytes(folder: Folder, name: str, data: bytes) -> None:
    folder.replace([(name, lambda f: f.write(data))])


def replace_file(path, data: bytes, what: str = "folder") -> None:
    """Replace the file ``path`` (in an existing folder) with ``data``: a temporary file created exclusively
    beside it, renamed into place (``Folder.replace``)."""
    path = Path(path)
    write_bytes(Folder(path.parent, create=False, what=what), path.name, data)


def write_file(path, data: bytes | str, what: str = "output") -> None:
    """Replace the file ``path`` with ``data`` (text as UTF-8) in its folder, made where missing: a temporary
    file created exclusively beside it and renamed into place (``Folder.replace``); a symlink at the name is
    replaced, never followed. What the scripts write (exports, documents, figures' data)."""
    path = Path(path)
    write_bytes(Folder(path.parent, what=what), path.name, data.encode("utf-8") if isinstance(data, str) else data)


def write_figure(path, fig, what: str = "figure", **kwargs) -> None:
    """Save the matplotlib figure ``fig`` as ``path`` (its format from the suffix), as ``write_file`` does."""
    path = Path(path)
    Folder(path.parent, what=what).replace(
        [(path.name, lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or None, **kwargs))])


def json_bytes(value, indent: int | None = 1) -> bytes:
    return json.dumps(value, indent=indent).encode()


def buffer(write: Callable) -> bytes:
    """What ``write(file)`` writes, as bytes (for writers that need a seekable file)."""
    buf = io.BytesIO()
    write(buf)
    return buf.getvalue()


# ---- folders the library made, and their removal ----------------------------------------------------------
# Every folder this process made through the layer (``Folder(path)`` for the outermost folder it had to make,
# ``Folder.sub`` for each component, ``make_private``), by absolute path, with the identity (device, inode) it
# had when made: ``remove_made`` removes only these, and only while the entry at that path is still the same
# real folder (a folder swapped or replaced by a symlink since is left alone).
_MADE: dict[str, tuple[int, int]] = {}


def outermost_missing(path: Path) -> Path | None:
    """The outermost folder that ``path.mkdir(parents=True)`` would make (None when ``path`` exists)."""
    path = Path(os.path.abspath(path))
    if os.path.lexists(path):
        return None
    while not os.path.lexists(path.parent) and path.parent != path:
        path = path.parent
    return path


def _record(path, st: os.stat_result | None = None) -> None:
    try:
        st = st or os.stat(path, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        _MADE[os.path.abspath(path)] = (st.st_dev, st.st_ino)


def made(path) -> bool:
    """Whether this process made the folder ``path`` through the layer (and it is still that folder)."""
    key = os.path.abspath(path)
    try:
        st = os.stat(key, follow_symlinks=False)
    except OSError:
        return False
    return _MADE.get(key) == (st.st_dev, st.st_ino) and stat.S_ISDIR(st.st_mode)


def make_private(parent, prefix: str, what: str = "folder") -> Path:
    """A new folder ``<parent>/<prefix><random>`` that only this run uses: created exclusively (``mkdir`` fails
    where the name exists, so no other process's folder and no planted symlink is taken over), mode 0700, and
    recorded for ``remove_made``. ``parent`` is made where missing (``Folder``)."""
    base = Folder(parent, what=what)
    check_name(prefix, what)
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(4)}"
        try:
            os.mkdir(name, 0o700, dir_fd=base.fd)
        except FileExistsError:
            continue
        except OSError as e:
            raise FileIOError(f"{what} {base.path}: cannot make a folder there ({why(e)})") from None
        _record(base.path / name, os.stat(name, dir_fd=base.fd, follow_symlinks=False))
        return Path(os.path.abspath(base.path / name))
    raise FileIOError(f"{what} {base.path}: no free folder name starting with {prefix}")


def remove_made(path) -> bool:
    """Remove the folder ``path`` and everything in it, where this process made it through the layer
    (``made``): the parent is opened as a descriptor, the entry checked to be that same real folder, and
    the tree removed relative to descriptors without following a symlink inside it (``shutil.rmtree``
    with ``dir_fd``; a symlink inside is removed itself, never its target). Returns whether it removed
    it; a folder the library did not make and record (or that was replaced since) is left alone."""
    import shutil

    key = os.path.abspath(path)
    ident = _MADE.get(key)
    if ident is None:
        return False
    p = Path(key)
    try:
        parent = Folder(p.parent, create=False, what="folder")
        st = os.stat(p.name, dir_fd=parent.fd, follow_symlinks=False)
    except (FileIOError, OSError):
        return False
    if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != ident:
        return False
    del _MADE[key]
    for other in [k for k in _MADE if k.startswith(key + os.sep)]:
        del _MADE[other]
    shutil.rmtree(p.name, ignore_errors=True, dir_fd=parent.fd)
    return not os.path.lexists(key)


# ---- archives ----------------------------------------------------------------------------------------------
ARCHIVE_CAP = 1 << 40  # an archive's own size, and the most its members may unpack to in all (1 TiB)
ARCHIVE_MEMBERS = 2_000_000  # members of one archive (ImageNet's training archive holds 1.28 million)


def _member_parts(name: str, what: str) -> list[str]:
    """The components of an archive member's name, each a name inside the target folder: no absolute path,
    no '..', each a name ``check_name`` takes (``.`` and empty components are dropped, as ``tarfile`` and
    ``zipfile`` do)."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        raise FileIOError(f"{what} holds a member outside its folder ({name[:80]!r}: an absolute path); refusing "
                          f"to unpack it")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    for p in parts:
        if p == "..":
            raise FileIOError(f"{what} holds a member outside its folder ({name[:80]!r}); refusing to unpack it")
        try:
            check_name(p, what)
        except FileIOError:
            raise FileIOError(f"{what} holds a member it may not unpack ({name[:80]!r}: not a file name the library "
                              f"writes); refusing it") from None
    return parts


def _zip_members(z: zipfile.ZipFile, what: str):
    for i in z.infolist():
        mode = stat.S_IFMT(i.external_attr >> 16) if i.create_system == 3 else 0  # Unix: the file's type
        kind = "dir" if i.filename.endswith("/") else "file"  # (ZipInfo.is_dir fails on an empty name)
        if mode and mode not in (stat.S_IFREG, stat.S_IFDIR):
            kind = _kind(mode)
        if i.flag_bits & 0x1:
            kind = "an encrypted member"
        yield i.filename, kind, i.file_size, i


def _tar_members(t, what: str, limit: int):
    count = 0
    while True:
        m = t.next()
        if m is None:
            return
        count += 1
        if count > limit:  # stop reading headers: a bomb of members is refused before its end
            yield m.name, "file", 0, None
            return
        kind = ("file" if m.isreg() else "dir" if m.isdir() else "a symlink" if m.issym() else
                "a hard link" if m.islnk() else "a device" if (m.ischr() or m.isblk()) else
                "a FIFO" if m.isfifo() else "not a regular file")
        yield m.name, kind, m.size if m.isreg() else 0, m


def _put(folder: Folder, name: str, write: Callable) -> None:
    """``Folder.replace`` of one file, in one open: ``write(file)`` into a new temporary file created
    exclusively beside ``name`` (no symlink followed), renamed into place; the temporary file is removed
    when the write fails."""
    for _ in range(100):
        tmp = f"{name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = _new_file(tmp, folder.fd)
            break
        except FileExistsError:
            continue
    else:
        raise FileIOError(f"no free temporary name beside {folder.path / name}")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    except BaseException:
        folder._drop([tmp])
        raise


def extract(path, folder: Folder, what: str = "archive", ratio: float = UNPACK_RATIO, cap: int = ARCHIVE_CAP,
            max_members: int = ARCHIVE_MEMBERS, hint: str = "") -> int:
    """Unpack the zip or tar archive ``path`` into ``folder``; returns the number of files written.

    Every member's header is checked before anything is written: its name confined to the folder (no absolute
    path, no '..'), its kind a regular file or a folder (a symlink, hard link, device, FIFO or encrypted
    member is refused: the rules of Python's ``tarfile`` 'data' filter, for zip and tar alike, on any Python),
    at most ``max_members`` members, and their sizes at most ``ratio`` times the archive's own size and at most
    ``cap`` in all. Then each file is written through the folder (``Folder.replace``: every folder on the way
    a real one, reached without following a symlink, the file created exclusively and renamed into place),
    copied up to its declared size. A refusal is one line (``FileIOError``), with ``hint`` added to a size
    refusal; a refused archive writes nothing."""
    import tarfile

    name = Path(path).name
    label = f"{what} {name}"
    with open_read(path, what, cap) as f:
        size = max(os.fstat(f.fileno()).st_size, 1)
        try:
            if zipfile.is_zipfile(f):
                f.seek(0)
                arc = open_zip(f, lambda w: f"could not unpack {name} ({w}); is it a complete zip or tar archive?")
                members = _zip_members(arc, label)
                opener = arc.open
            elif name.lower().endswith(".zip"):
                raise FileIOError(f"{name} is not a complete zip archive; is the download complete?")
            else:
                f.seek(0)
                arc = tarfile.open(fileobj=f, mode="r:*")
                members = _tar_members(arc, label, max_members)
                opener = arc.extractfile
        except (*ZIP_DAMAGED, tarfile.TarError, OSError, EOFError, ValueError) as e:
            raise FileIOError(f"could not unpack {name} ({why(e)}); is it a complete zip or tar archive?") from None
        with arc:
            plan, total = [], 0
            limit = min(cap, int(ratio * size))
            try:
                for member, kind, nbytes, handle in members:
                    if len(plan) >= max_members:
                        raise FileIOError(f"{label} holds more than {max_members} members; refusing it")
                    parts = _member_parts(member, label)
                    if kind not in ("file", "dir"):
                        raise FileIOError(f"{label} holds a member it may not unpack ({member[:80]!r}: {kind}); "
                                          f"refusing it")
                    if kind == "file" and not parts:
                        raise FileIOError(f"{label} holds a member it may not unpack ({member[:80]!r}: a file "
                                          f"without a name); refusing it")
                    total += nbytes
                    if total > limit:
                        raise FileIOError(f"{label} would unpack to more than {total / 1e6:.1f} MB, over "
                                          f"{ratio:g} times its size or {cap} bytes (a zip bomb?); refusing it{hint}")
                    plan.append((parts, kind, nbytes, handle))
            except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError) as e:
                raise FileIOError(f"could not unpack {name} ({why(e)}); is the download complete?") from None
            written = 0
            here: tuple[tuple[str, ...], Folder] | None = None
            for parts, kind, nbytes, handle in plan:
                where = tuple(parts if kind == "dir" else parts[:-1])
                if here is None or here[0] != where:
                    here = (where, folder._walk(list(where), True, what) if where else folder)
                if kind == "dir":
                    continue
                try:
                    src = opener(handle)
                    if src is None:
                        raise FileIOError(f"{label}: {'/'.join(parts)} cannot be read")
                    with src:
                        def copy(out, src=src, nbytes=nbytes, member="/".join(parts)):
                            left = nbytes
                            while left > 0:
                                chunk = src.read(min(left, 1 << 20))
                                if not chunk:
                                    raise FileIOError(f"{label}: {member[:80]} is cut short; is the download complete?")
                                out.write(chunk)
                                left -= len(chunk)
                        _put(here[1], parts[-1], copy)
                except FileIOError:
                    raise
                except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, RuntimeError, ValueError) as e:
                    raise FileIOError(f"could not unpack {name} ({why(e)}); is the download complete?") from None
                written += 1
    return written
