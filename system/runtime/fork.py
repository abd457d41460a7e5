"""The fork executor (``--executor fork``, the CPU default): clients live in single-thread worker
processes forked from this one.

Why processes: at PFLlib's small batches (``-lbs 10``) a training step is a handful of tiny kernels that
scale badly over OpenMP threads (every kernel ends in a barrier, and on a busy machine a descheduled
thread stalls the others), while independent processes scale with the cores (docs/performance.md). Why
fork: the workers see the split's tensors, loaded once in this process, without copying or pickling them.

Each worker builds its share of the clients (``executors.balance`` by training samples) and keeps them
for the whole run; a request is one pickled message per worker per call (arguments shared by several
clients, such as the broadcast model, are pickled once), and its answer the pickled return values (tensors
travel as their raw bytes: ``dumps``). A
worker exits when this process closes the pool or dies (its end of the pipe closes; on Linux the kernel
also signals it). CPU only: CUDA does not survive a fork.
"""
from __future__ import annotations

import ctypes
import io
import multiprocessing
import pickle
import signal
import traceback

import torch

from runtime.executors import ClientHost, PoolExecutor, WorkerLost
from utils.errors import FLError

POLL_S = 1.0  # how often a waiting server checks that the worker it waits on is alive
# dtypes whose tensors travel as numpy arrays (the rest, e.g. bfloat16, by torch's own pickling)
_RAW_DTYPES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
               torch.uint8, torch.bool}


def dumps(obj) -> bytes:
    """``obj`` pickled for the pipe. Torch pickles each tensor's storage as a ``torch.save`` archive, which
    costs several times the copy itself to write and to read (the CNN's 2.3 MB state round-trips in 6.3 ms
    that way, 2.4 ms this way, on a loaded 2-core machine); a dense CPU tensor that owns its whole storage
    travels here as a numpy array of the same bytes instead, and arrives with the same dtype, shape, strides
    and ``requires_grad``. Anything else (views into a larger storage, other layouts and dtypes, non-leaf
    tensors) is pickled as torch does it."""
    buf = io.BytesIO()
    _RawTensorPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class _RawTensorPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if (type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided
                and obj.dtype in _RAW_DTYPES and obj.storage_offset() == 0
                and obj.untyped_storage().nbytes() == obj.numel() * obj.element_size()
                and (obj.is_leaf or not obj.requires_grad) and not obj.is_conj() and not obj.is_neg()):
            return _raw_tensor, (obj.detach().numpy(), obj.stride(), obj.requires_grad)
        return NotImplemented


def _raw_tensor(array, stride: tuple, requires_grad: bool) -> torch.Tensor:
    # Rebuilt with the sender's strides (a 1-channel weight in channels-last layout is "contiguous" with
    # other strides than numpy's, and a kernel may take another path, and sum in another order, on them) in
    # torch's own aligned memory: the executors' numbers are the sequential path's bit for bit.
    values = torch.from_numpy(array)
    out = torch.empty_strided(values.shape, stride, dtype=values.dtype)
    return out.copy_(values).requires_grad_(requires_grad)


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (prctl PR_SET_PDEATHSIG); a no-op elsewhere.
    The closed pipe ends a waiting worker anyway; this also ends one that is busy computing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross to the server: itself when it pickles (with the worker's traceback as a
    note unless it is an FLError, whose one line says what to do), else a RuntimeError with the trace."""
    trace = "".join(traceback.format_exception(exc))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 -- any failure to pickle means: send the text instead
        return RuntimeError(f"in a fork worker:\n{trace}")
    if not isinstance(exc, FLError):
        exc.add_note(f"in a fork worker:\n{trace}")
    return exc


def _import_what_a_worker_would() -> None:
    """Import in this process what a client's first optimizer imports lazily (``torch._dynamo``, about a
    CPU-second), so that the workers forked next inherit it instead of each importing it again: a run on 2
    workers costs 2 CPU-seconds less (docs/performance.md)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)


def _serve(conn, others, factory, cids, datas, parking, total) -> None:
    """A worker's life: build its clients, then answer requests until told to stop or the pipe closes."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server ends us
    for c in others:  # other workers' pipe ends, inherited by the fork: not ours to keep open
        c.close()
    torch.set_num_threads(1)
    try:
        host = ClientHost(factory, cids, datas, parking=parking, total=total)
        answer = (True, None)
    except Exception as e:  # noqa: BLE001 -- reported to the server, which raises it
        host, answer = None, (False, _portable(e))
    conn.send_bytes(dumps(answer))
    while host is not None:
        try:
            request = pickle.loads(conn.recv_bytes())
        except EOFError:  # the server is gone
            break
        if request is None:
            break
        try:
            answer = (True, host.handle(request))
        except Exception as e:  # noqa: BLE001 -- reported to the server, which raises it
            answer = (False, _portable(e))
        conn.send_bytes(dumps(answer))
    conn.close()


class ForkExecutor(PoolExecutor):
    """``workers`` forked single-thread processes holding the clients."""
    name = "fork"

    def __init__(self, workers: int, parking=None):
        super().__init__(parking)
        self.max_workers = max(1, workers)
        self.procs: list = []
        self.conns: list = []

    def _launch(self) -> None:
        self._stop()
        _import_what_a_worker_would()
        ctx = multiprocessing.get_context("fork")
        total = len(self.datas)
        for cids in self.placement:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, daemon=True, args=(
                theirs, list(self.conns), self.factory, cids, [self.datas[c] for c in cids], self.parking, total))
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        self._receive(list(range(len(self.procs))))  # every client built, or the first error raised

    def _send(self, worker: int, request: tuple) -> int:
        try:
            self.conns[worker].send_bytes(dumps(request))
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise WorkerLost(self._obituary(worker)) from None
        return worker

    def _receive(self, tickets: list[int]) -> list:
        """The answers of ``tickets`` (worker indices), in order. Every answer is read before an error
        is raised, so the pipes stay in step."""
        answers, lost = [], None
        for w in tickets:
            try:
                answers.append(self._answer(w))
            except WorkerLost as e:
                lost = lost or e
                answers.append((False, None))
        if lost is not None:
            raise lost
        for ok, value in answers:
            if not ok:
                raise value
        return [value for _, value in answers]

    def _answer(self, w: int) -> tuple:
        conn, proc = self.conns[w], self.procs[w]
        while not conn.poll(POLL_S):
            if not proc.is_alive():
                raise WorkerLost(self._obituary(w))
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionResetError):
            raise WorkerLost(self._obituary(w)) from None

    def _obituary(self, w: int) -> str:
        self.procs[w].join(timeout=1)
        return (f"fork worker {w} died (exit code {self.procs[w].exitcode}; out of memory? try fewer "
                f"--workers or --client_state cpu)")

    def _stop(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
            conn.close()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs, self.conns = [], []

    def close(self) -> None:
        self._stop()
        if self.parking is not None:
            self.parking.release()
