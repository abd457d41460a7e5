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


UNPACK_RATIO = 200.0  # an npz unpacks to at most this many times its own size (np.savez stores: about 1)


def read_npz(path, names: Iterable[str], what: str = "file", cap: int = NPZ_CAP, follow: bool = True,
             ratio: float = UNPACK_RATIO) -> dict:
    """The arrays ``names`` of an npz, read without unpickling: the zip's headers (the uncompressed size of
    every member asked for, at most ``cap`` in all and ``ratio`` times the file's size) and each array's npy header (its declared size within
    what the member holds) are checked before any array is read. Arrays come back in native byte order."""
    import numpy as np

    out = {}
    with open_read(path, what, cap=max(cap, NPZ_CAP), follow=follow) as f:
        try:
            z = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise FileIOError(f"{what} {path} is not an npz ({why(e)})") from None
        with z:
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
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
        fd = os.dup(self.fd)
        path = self.path
        try:
            for part in relative_parts(rel, what):
                path = path / part
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
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


def json_bytes(value, indent: int | None = 1) -> bytes:
    return json.dumps(value, indent=indent).encode()


def buffer(write: Callable) -> bytes:
    """What ``write(file)`` writes, as bytes (for writers that need a seekable file)."""
    buf = io.BytesIO()
    write(buf)
    return buf.getvalue()
