"""Shared fixtures: tiny splits generated once per session into temporary folders.

What an algorithm's own test uses (docs/adding_an_algorithm.md): the split fixtures ``digits_tiny_root`` (5
unequal clients, runs of a few rounds in under a second), ``digits_root`` (5 IID clients of about the same
size) and ``digits_noniid_root`` (6 clients, 2 classes each), each a dataset root holding 'Digits';
``build_server(root, out, "-algo", NAME, *flags)``, a server and its clients in this process, driven through
public methods (``run_round``, ``aggregate``, ``evaluate``, ``train``; a client's ``receive``, ``train``,
``upload``, ``batches``); ``cli(root, out, *flags)``, the flags of a short quiet run, for ``main.main`` or
``cli.parse_config``."""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
# The offline copies of the real datasets, beside the repository on the project's own machines; tests that
# read them carry the marker ``shared_data`` and skip where the folder is absent (a user's fresh clone).
SHARED_DATA = REPO.parent / "shared" / "data"

# No test reads or writes the repository's own results/ or dataset/<split>/: the defaults of --results_dir,
# --dataset_root and the generators' --root (utils/paths.py) point at this process's temporary folder, and
# subprocesses inherit them. ``repository_untouched`` below checks that nothing appeared there anyway.
SANDBOX = Path(tempfile.mkdtemp(prefix="pfl-tests-"))
os.environ["PFL_RESULTS_DIR"] = str(SANDBOX / "results")
os.environ["PFL_DATASET_ROOT"] = str(SANDBOX / "dataset")

import torch  # noqa: E402
from runtime import loop

# Two test processes on two cores spin-wait on each other's OpenMP threads; one thread each is faster.
torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the ``xdist_group`` marks ``regroup`` adds
def pytest_collection_modifyitems(config, items):
    """A test marked ``optional_deps("opacus", ...)`` needs those packages of requirements-optional.txt; it
    skips with a reason where one is absent (``pytest -m optional_deps`` runs just these, as .ci/run does).
    A test marked ``shared_data`` reads the offline datasets beside the repository and skips without them."""
    found: dict[str, bool] = {}
    for item in items:
        if item.get_closest_marker("shared_data") and not SHARED_DATA.is_dir():
            item.add_marker(pytest.mark.skip(reason=f"needs the offline datasets in {SHARED_DATA}"))
        for mark in item.iter_markers("optional_deps"):
            absent = [p for p in mark.args if not found.setdefault(p, importlib.util.find_spec(p) is not None)]
            if absent:
                item.add_marker(pytest.mark.skip(
                    reason=f"needs {', '.join(absent)} (pip install -r requirements-optional.txt)"))
    regroup(items)


def regroup(items) -> None:
    """Tests that read one result cached in the test process (a training run read by several checks:
    ``sequential_series``, the behaviour harness's ``run_series``) run in one test process, which computes
    it once. A test module says which cached result each of its tests reads with ``shared_run(item)`` (a
    name, the same in every module that reads it; None for a test that reads none). Each named test gets
    pytest-xdist's ``xdist_group`` mark of that name: under ``--dist loadgroup`` (pytest.ini) the tests of one
    name go to one test process, whichever modules they are in. Within its module a test also moves beside
    the others of its name (stably, where the module's tests stand), so a run in one process (``-n 0``, or
    another ``--dist``) computes it once as well."""
    start = 0
    while start < len(items):
        module = getattr(items[start], "module", None)
        end = start + 1
        while end < len(items) and getattr(items[end], "module", None) is module:
            end += 1
        shared = getattr(module, "shared_run", None)
        if shared is not None:
            named = [(item, shared(item)) for item in items[start:end]]
            first: dict = {}  # a name's place: where its first test stands (a test without one keeps its own)
            place = [first.setdefault(name, i) if name is not None else i for i, (_, name) in enumerate(named)]
            order = sorted(range(len(named)), key=place.__getitem__)
            items[start:end] = [named[i][0] for i in order]
            for item, name in named:
                if name is not None:
                    item.add_marker(pytest.mark.xdist_group(name))
        start = end


_RUNNING: list = [None]  # the test being run in this process
# Every test on tests/test_executors.py's one Ray session (``ray_pool``): starting Ray is the slow part, so one
# test process takes them all, and reads the sequential runs they compare with there.
RAY_POOL = "ray-pool"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _RUNNING[0] = item


def reading_shared(name: str) -> None:
    """Called by a result cached in the test process (``sequential_series``, the behaviour harness's
    ``run_series``) as a test reads it: that test's module must name it (``shared_run``), or the result
    would be computed again by every test process that takes one of its readers."""
    item = _RUNNING[0]
    declared = [m.args[0] for m in item.iter_markers("xdist_group")]
    assert declared in ([name], [RAY_POOL]), (f"{item.nodeid} reads the cached run {name!r}; its module's "
                                              f"shared_run(item) must return that name (it gives "
                                              f"{declared[0] if declared else None!r})")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SANDBOX, ignore_errors=True)


def _listing(folder: Path) -> set[tuple[str, int, int]]:
    """(path, size, mtime) of every file under ``folder``, the library's own source and byte code left out
    (editing a generator while the suite runs is not a test's doing)."""
    out = set()
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                continue
            st = os.lstat(os.path.join(top, f))
            out.add((os.path.relpath(os.path.join(top, f), folder), st.st_size, st.st_mtime_ns))
    return out


@pytest.fixture(scope="session", autouse=True)
def repository_untouched():
    """The repository's results/ and dataset/ are as the session found them (a test that wrote there would
    read a user's own files on the next run, or leave files in their clone)."""
    watched = [REPO / "results", REPO / "dataset"]
    before = [_listing(f) for f in watched]
    yield
    for folder, was in zip(watched, before):
        now = _listing(folder)
        assert now == was, (f"tests changed {folder}: added or changed {sorted(p for p, *_ in now - was)[:5]}, "
                            f"removed {sorted(p for p, *_ in was - now)[:5]}")


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory) -> Path:
    """Dataset root holding 'Digits': 5 clients, IID, 75/25 split (about 270 train samples each)."""
    from dataset import generate_Digits

    root = tmp_path_factory.mktemp("data")
    assert generate_Digits.main(["--root", str(root), "--num-clients", "5", "--partition", "iid",
                                 "--balance", "--seed", "1"]) == 0
    return root


@pytest.fixture(scope="session")
def digits_noniid_root(tmp_path_factory) -> Path:
    """Dataset root holding 'Digits': 6 clients, 2 classes each (pathological)."""
    from dataset import generate_Digits

    root = tmp_path_factory.mktemp("data_pat")
    assert generate_Digits.main(["--root", str(root), "--num-clients", "6", "--partition", "pat",
                                 "--class-per-client", "2", "--seed", "1"]) == 0
    return root


@pytest.fixture(scope="session")
def digits_tiny_root(tmp_path_factory) -> Path:
    """Dataset root holding 'Digits': 500 of the images among 5 clients by Dir(1.0), 37-98 training
    samples each (unequal, so placement over workers is uneven): runs of a few rounds take under a second."""
    from dataset import generate_Digits

    root = tmp_path_factory.mktemp("data_tiny")
    assert generate_Digits.main(["--root", str(root), "--num-clients", "5", "--partition", "dir", "--alpha", "1.0",
                                 "--subsample", "500", "--seed", "1"]) == 0
    return root


@pytest.fixture
def stop_in_round(monkeypatch):
    """``stop_in_round(r, exc)``: the runs that follow stop in round ``r`` once it is evaluated, by ``exc``
    raised from ``Server.after_round`` (a crash by default; ``KeyboardInterrupt`` stands for a signal);
    ``stop_in_round(None)`` lets them run to their end again."""
    from flcore.servers.serverbase import Server

    original = Server.after_round

    def install(round_idx: int | None, exc: BaseException | type = RuntimeError("killed")) -> None:
        def after_round(self):
            if self.round_idx == round_idx:
                raise exc
            original(self)

        monkeypatch.setattr(Server, "after_round", original if round_idx is None else after_round)

    return install


def cli(root: Path, out: Path, *extra: str) -> list[str]:
    """Command-line flags for a short quiet CPU run on a test split. Tests rerun into one folder on purpose
    (same seed twice, a flag on and off), so existing result files are replaced (``--overwrite``)."""
    return ["-data", "Digits", "--dataset_root", str(root), "--results_dir", str(out), "-dev", "cpu",
            "--no-progress", "--no-print_config", "--overwrite", *extra]


def plugin(server, name: str):
    """The server's built plug-in of class ``name`` (plugins/), or None when the flags left it off."""
    return next((p for p in server.plugins if type(p).__name__ == name), None)


def opened(uploads: list) -> list:
    """Uploads as sent: a sealed upload (under a robust ``--aggregator``, utils/entries.py) opened, for a test
    that watches ``average_uploads``, the seam that opens them."""
    return [u.opened() if hasattr(u, "opened") else u for u in uploads]


QUICK = ("-lr", "0.1", "-lbs", "20", "--executor", "sequential")  # a short in-process run (build_server's flags)


def build_server(root: Path, out: Path, *flags: str, clients: int | None = None, new: int = 0, run: int = 0,
                 recorder=None):
    """A server and its clients in this process, built as main.run builds one but with no recorder unless given
    (so it writes no result file): a quick run (``-lr 0.1 -lbs 20``, sequential executor) on the split 'Digits' under
    ``root`` (its first ``clients`` clients; ``new`` more held out for -nnc), as run ``run``. Tests drive it with
    ``loop.run_round(server, t)``, ``loop.evaluate(server)`` or ``loop.train(server)``."""
    from cli import parse_config
    from flcore.registry import get_server_class
    from utils.data_utils import load_split

    cfg = parse_config(cli(root, out, *QUICK, *flags))
    data = load_split("Digits", root, clients, new_clients=new)
    return get_server_class(cfg.algorithm)(cfg.replace(num_classes=data.num_classes), data, run, recorder)


_OBSERVED: dict = {}


def observed_name(algo: str) -> str:
    """The name, for ``regroup``, of ``two_observed_rounds``'s run of ``algo``."""
    return f"observed {algo}"


def two_observed_rounds(root: Path, algo: str) -> SimpleNamespace:
    """Rounds 0 and 1 of ``algo`` on the split under ``root``, built by ``build_server`` (FedBN on its
    BNCNN) and run by ``loop.run_round``, with what crossed the wire: ``rounds``, for each round, every
    uploading client's personal entries (its ``personal_keys``) as they were when it uploaded, after
    training, and the uploads; ``broadcasts``, round 1's payloads (``Server.broadcast``), by client id; and
    the ``server`` after both rounds. Made once per test process (tests/test_comm.py and
    tests/test_executors.py read it); callers must not change it."""
    reading_shared(observed_name(algo))
    if algo not in _OBSERVED:
        server = build_server(root, root, "-algo", algo, "-gr", "2", *(("-m", "BNCNN") if algo == "FedBN" else ()))
        rounds, broadcasts = [], {}
        receive, broadcast = loop.receive, server.broadcast

        def receive_and_keep(srv, clients):
            personal = {c.id: {k: v.detach().clone() for k, v in c.model.state_dict().items()
                               if k.startswith(c.personal_keys)} for c in clients}
            uploads = receive(srv, clients)
            rounds.append(SimpleNamespace(personal=personal, uploads=uploads))
            return uploads

        def broadcast_and_keep(client):
            payload = broadcast(client)
            if server.round_idx == 1:
                broadcasts[client.id] = payload
            return payload

        loop.receive, server.broadcast = receive_and_keep, broadcast_and_keep  # restored below
        try:
            loop.run_round(server, 0)
            loop.run_round(server, 1)
        finally:
            loop.receive = receive
            del server.broadcast
        _OBSERVED[algo] = SimpleNamespace(rounds=rounds, broadcasts=broadcasts, server=server)
    return _OBSERVED[algo]


_SEQUENTIAL_RUNS: dict = {}


def sequential_name(*flags: str) -> str:
    """The name, for ``regroup``, of ``sequential_series``'s run of ``flags`` on the tiny split: the same
    flags, the same run, the same name."""
    return "sequential " + " ".join(flags)


def sequential_series(root: Path, tmp_path_factory, *flags: str) -> dict:
    """The recorded series (all but the wall times) of a run through ``main.main`` on the split under ``root``
    with ``flags`` (``cli``'s quiet defaults added), each (split, flags) run once per test process: the
    undisturbed sequential run that tests/test_executors.py compares every executor with (and so the first of
    the two runs of its determinism check, ``test_fork_matches_sequential``).
    Callers must not change what it returns."""
    import main
    from cli import algorithm_arg
    from utils.results import read_h5

    key = (str(root), flags)
    reading_shared(sequential_name(*flags))
    if key not in _SEQUENTIAL_RUNS:
        out = tmp_path_factory.mktemp("seq")
        argv = cli(root, out, *flags)
        assert main.main(argv) == 0
        _SEQUENTIAL_RUNS[key] = {k: v for k, v in read_h5(out / f"Digits_{algorithm_arg(argv)}_test_0.h5").items()
                                 if k != "rs_round_time"}
    return _SEQUENTIAL_RUNS[key]


@pytest.fixture(scope="module")
def digits_images():
    """sklearn's digits as the splits store them: pixels in [0, 1] (x / 16), the same normalised to [-1, 1],
    and the labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    pixels = torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None]
    return pixels, (pixels - 0.5) / 0.5, torch.tensor(d.target)


@pytest.fixture(scope="module")
def digits_mlp():
    """A seeded DNN for 8x8 digits (the attack tests' model); each test module gets its own."""
    from flcore.trainmodel.models import DNN
    from utils.seeding import torch_seeded

    with torch_seeded(0, 0, "model"):
        return DNN(64, 10)


def zip_version_21(blob: bytes) -> bytes:
    """``blob`` (a zip) whose first central-directory entry says it needs zip version 21.0, which zipfile
    does not take (it raises NotImplementedError, not BadZipFile): the header a flipped byte once made."""
    blob = bytearray(blob)
    at = blob.index(b"PK\x01\x02")  # the first central-directory entry; its version needed at offset 6
    blob[at + 6:at + 8] = (210).to_bytes(2, "little")
    return bytes(blob)
