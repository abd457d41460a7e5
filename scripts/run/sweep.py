"""Sweeps: a grid of flags x seeds, one ``system/main.py`` process per (configuration, seed), resumable.

    python scripts/run/sweep.py -data Digits -gr 20 -lr 0.1 --grid "-algo=FedAvg,FedALA,Ditto" --seeds 0,1,2 -j 2
    python scripts/run/sweep.py --config scripts/experiments/benchmark_zoo.json --dry-run      # list the commands only

Every flag that is not the sweep's own goes to every job unchanged. ``--grid`` takes ``FLAG=v1,v2,...``
items (the product of all of them is run); a flag without a value (``-ala``) takes ``true``/``false``.
``-algo=all`` means every registered algorithm, in registry order, so new algorithms join automatically.
``--config`` reads a JSON file: ``base`` (flags for every job), ``grids`` (a list of grids, each a dict
flag -> list of values; the jobs are the union of their products), ``per_algorithm`` (``-algo`` name ->
flags its jobs need on top, e.g. FedBN's BatchNorm model), ``seeds``, ``tag``, ``out``, ``checkpoint_every``,
``export`` (a committed export, see ``exported_runs``: its finished runs are not rerun, so a fresh clone resumes the
sweep where the export stops; ``--export`` on the command line); the
command line adds to it (its flags after ``base``, its ``--grid`` items override those keys in every
grid, its ``--seeds``/``--tag``/``--out`` replace the file's).

A job is one run index ``i`` (``-pv i -t i+1``: seed ``--seed`` + i, file suffix ``_i``). Its ``-go`` is
``<tag>-<hash>``, where the hash (8 hex digits) covers every flag whose effective value after parsing
differs from its default (so ``-lr 0.1`` and ``--local_learning_rate 0.10`` are one configuration, and a
flag added to the library later leaves existing names alone) except the seed's run index, the tag
itself and where or how the run executes (device, executor, workers, paths, checkpointing). Runs
that differ in any other flag therefore never share a file, and two jobs of one sweep that would are
refused before anything runs. Jobs run with ``--checkpoint_every N --resume`` (N = ``--checkpoint-every``,
default 1; a checkpoint of 20 CNN clients is ~75 MB, about half a FedAvg round's CPU time on a 2,000-image
split, so long sweeps save every few rounds and an interruption repeats at most N - 1): a job whose result file
is complete (its last evaluation is round ``-gr``, or its sidecar's status is finished or diverged) is
skipped, an interrupted one continues from its last round, and a finished job's checkpoint is deleted
(``--keep-checkpoints`` keeps it). Each job's output goes to ``<out>/logs/<result name>.log``; a job
that fails is reported with its command and log and the others go on; the exit code is 1 when any job
failed or was refused. Ctrl-C stops the sweep (no further job starts); the same command resumes it.
With ``-j`` > 1, ``--executor sequential`` lets the jobs share the cores instead of each starting a
worker process per core.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from utils import fileio  # noqa: E402
from utils.errors import FLError  # noqa: E402

MAIN = REPO / "system" / "main.py"
# Config keys that do not change a run's numbers (where and how it runs, paths, checkpointing) or that
# name it (goal, run index): left out of the configuration hash.
NOT_HASHED = {"goal", "prev", "times", "resume", "checkpoint_every", "progress", "results_dir", "dataset_root",
              "save_folder_name", "device", "device_id", "executor", "workers", "gpus_per_worker", "ray_address",
              "max_restarts", "client_state", "client_state_dir"}
# Flags the sweep sets on every job itself.
RESERVED = {"-go", "--goal", "-pv", "--prev", "-t", "--times", "--results_dir", "--checkpoint_every", "--resume"}
TRUE, FALSE = {"true", "on", "yes", "1"}, {"false", "off", "no", "0"}


class SweepError(Exception):
    """A sweep that cannot start (bad grid, duplicate result names): one line, exit code 2."""


@dataclass
class Job:
    argv: list[str]  # flags for system/main.py
    stem: str  # result file name without extension
    out: Path
    gr: int
    grid_point: dict = field(default_factory=dict)

    @property
    def h5(self) -> Path:
        return self.out / f"{self.stem}.h5"

    @property
    def log(self) -> Path:
        return self.out / "logs" / f"{self.stem}.log"

    @property
    def ckpt(self) -> Path:
        return self.out / f"{self.stem}.ckpt"

    def command(self) -> list[str]:
        return [sys.executable, str(MAIN), *self.argv]

    def shown(self) -> str:
        return f"python {os.path.relpath(MAIN)} " + " ".join(shlex.quote(a) for a in self.argv)

    @property
    def key(self) -> tuple[str, int]:
        """(``-go``, run index): the configuration (its hash covers dataset, algorithm and every other
        flag that changes a number) and the seed."""
        return flag_value(self.argv, "-go"), int(flag_value(self.argv, "-pv") or 0)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after the last ``flag`` in ``argv``, if any."""
    at = [i for i, a in enumerate(argv[:-1]) if a == flag]
    return argv[at[-1] + 1] if at else None


def exported_runs(path: Path | None) -> frozenset:
    """The (``-go``, run index) of every run an export holds as finished or diverged: a sweep whose raw results
    are gone (another machine, a fresh clone) does not rerun them. Two forms: ``splits`` (the benchmark
    exports, ``scripts/experiments/benchmark_report.py``: one ``command`` per entry, its runs by ``run``) and a
    top-level ``runs`` list whose entries name their own ``goal`` and run index ``seed`` (the converged
    robustness export, ``scripts/experiments/robustness_report.py``); an entry without a goal is not counted."""
    if path is None or not os.path.lexists(path):
        return frozenset()
    ended = ("finished", "diverged")
    try:
        data = _typed(fileio.read_json(path, "export"), dict, "export")
        done = set()
        for entries in _typed(data.get("splits", {}), dict, "splits").values():
            for entry in _typed(entries, dict, "export split").values():
                command = _typed(_typed(entry, dict, "export entry").get("command", ""), str, "command")
                goal = flag_value(shlex.split(command), "-go")
                done |= {(goal, r["run"]) for r in _typed(entry.get("runs", []), list, "runs")
                         if _typed(r, dict, "run").get("status") in ended and _is_index(r.get("run"))}
        done |= {(r["goal"], r["seed"]) for r in _typed(data.get("runs", []), list, "runs")
                 if _typed(r, dict, "run").get("status") in ended and isinstance(r.get("goal"), str)
                 and _is_index(r.get("seed"))}
    except (FLError, SweepError, ValueError) as e:
        raise SweepError(f"cannot read the export {path}: {' '.join(str(e).split())}") from None
    return frozenset(done)


def _is_index(value) -> bool:
    """A run index: an int, not a boolean (``True`` is an int to ``isinstance``) nor a string of digits."""
    return type(value) is int


def _typed(value, kind, what: str):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise SweepError(f"{what} is a {type(value).__name__}, not a {kind.__name__}")
    return value


# ---- building the job list ---------------------------------------------------------------------------
def split_grid_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Take the ``--grid`` items (``FLAG=values``, which argparse would read as unknown options) out of
    ``argv``; returns (grid items, the rest)."""
    items, rest, in_grid = [], [], False
    for arg in argv:
        if arg == "--grid":
            in_grid = True
        elif arg.startswith("--grid="):
            items.append(arg.split("=", 1)[1])
            in_grid = True
        elif in_grid and arg.startswith("-") and "=" in arg:
            items.append(arg)
        else:
            in_grid = False
            rest.append(arg)
    return items, rest


def parse_grid_items(items: list[str]) -> dict[str, list[str]]:
    grid: dict[str, list[str]] = {}
    for item in items:
        flag, _, values = item.partition("=")
        if not flag.startswith("-") or not values:
            raise SweepError(f"--grid item '{item}' is not FLAG=value1,value2,...")
        if flag in RESERVED:
            raise SweepError(f"--grid {flag}: the sweep sets {flag} itself (use --seeds, --tag, --out)")
        if flag in grid:
            raise SweepError(f"--grid names {flag} twice")
        grid[flag] = [v for v in values.split(",")]
    return grid


def expand_values(flag: str, values) -> list[str]:
    """A grid entry's values as strings; ``all`` for -algo = every registered algorithm."""
    from flcore.registry import ALGORITHMS

    if isinstance(values, (str, int, float, bool)):
        values = [values]
    out = []
    for v in values:
        v = str(v).lower() if isinstance(v, bool) else str(v)
        if flag in ("-algo", "--algorithm") and v == "all":
            out.extend(ALGORITHMS)
        else:
            out.append(v)
    return out


def job_parser(argv: list[str]):
    """system/main.py's parser for the algorithm that ``argv`` selects (its own flags included)."""
    import cli

    return cli.parser_for(cli.algorithm_arg(argv))


def flag_takes_value(argv: list[str], flag: str) -> bool:
    action = next((a for a in job_parser(argv).flags if flag in a.option_strings), None)
    if action is None:
        import cli

        raise SweepError(f"--grid {flag}: not a flag of system/main.py for -algo {cli.algorithm_arg(argv)}")
    return not is_switch(action)


def is_switch(action) -> bool:
    """An on/off flag: ``store_true`` (value-less, or taking an optional explicit true/false)."""
    return action.nargs == 0 or (action.nargs == "?" and action.const is True)


def point_flags(point: dict[str, str], base: list[str]) -> list[str]:
    """Flags for one grid point; value-less flags are added for true and left out for false."""
    algo_first = sorted(point, key=lambda f: f not in ("-algo", "--algorithm"))
    flags: list[str] = []
    for flag in algo_first:
        value = point[flag]
        if flag_takes_value([*base, *flags], flag):
            flags += [flag, value]
        elif value.lower() in TRUE:
            flags.append(flag)
        elif value.lower() not in FALSE:
            raise SweepError(f"--grid {flag} takes no value: use {flag}=true or {flag}=false, not '{value}'")
    return flags


def config_hash(cfg_dict: dict, defaults: dict) -> str:
    """8 hex digits of the configuration's values that differ from their defaults (``NOT_HASHED`` aside):
    equal configurations however spelled get one hash, and a flag added to the library later (at its
    default) leaves existing names, and so finished jobs, as they are."""
    kept = {k: v for k, v in sorted(cfg_dict.items())
            if k not in NOT_HASHED and not (k in defaults and v == defaults[k])}
    return hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:8]


def parse_job_flags(argv: list[str]):
    """``cli.parse_config`` with its one-line error captured instead of printed; returns (cfg, error)."""
    import cli
    from utils.errors import FLError

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return cli.parse_config(argv), None
    except FLError as e:
        return None, str(e)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, lines[-1] if lines else "invalid flags"


def effective_defaults(flags: list[str], cfg, known: dict | None = None) -> dict:
    """Every flag's default for the algorithm ``flags`` select: the parser's, and for a flag whose parser
    default is None and that the algorithm resolves by itself (SCAFFOLD's and FedGH's ``-slr``, a server
    optimizer's step size) the value it resolves to when no flag sets it. An algorithm's own default then
    stays out of the hash, whether it lives in its parser or is resolved after parsing. They depend on the
    algorithm and the split only: ``known`` (one sweep's) keeps them per pair, so each is worked out once."""
    import cli

    key = (cli.algorithm_arg(flags), cfg.dataset)
    if known is not None and key in known:
        return known[key]
    plain_flags = ["-algo", key[0], "-data", key[1], "-go", "x"]
    defaults = {a.dest: a.default for a in job_parser(flags).flags if a.option_strings}
    plain, _ = parse_job_flags(plain_flags)
    if plain is not None:
        resolved = plain.to_dict()
        defaults |= {k: resolved[k] for k, v in defaults.items() if v is None and resolved.get(k) is not None}
    if known is not None:
        known[key] = defaults
    return defaults


def build_jobs(base: list[str], grids: list[dict], seeds: list[int], tag: str, out: Path,
               per_algorithm: dict | None = None, checkpoint_every: int = 1):
    """Returns (jobs, invalid): ``invalid`` lists (flags, one-line error) of grid points main.py refuses.
    ``per_algorithm``: flags added to every job of that ``-algo`` (after the grid's, so they win).
    Raises SweepError when two jobs would write one result file."""
    import cli
    import main

    for flag in RESERVED:
        if any(a == flag or a.startswith(flag + "=") for a in base):
            raise SweepError(f"{flag} is set by the sweep itself (use --seeds, --tag, --out)")
    jobs, invalid, seen_points, known = [], [], {}, {}
    for g, grid in enumerate(grids):
        keys = list(grid)
        for combo in itertools.product(*(expand_values(k, grid[k]) for k in keys)):
            point = dict(zip(keys, combo))
            key = tuple(sorted(point.items()))
            if seen_points.setdefault(key, g) != g:  # one point in two grids (of a file): one job
                continue
            flags = [*base, *point_flags(point, base)]
            flags += [str(a) for a in (per_algorithm or {}).get(cli.algorithm_arg(flags), [])]
            cfg, error = parse_job_flags([*flags, "-go", tag])
            if error:
                invalid.append((flags, error))
                continue
            goal = f"{tag}-{config_hash(cfg.to_dict(), effective_defaults(flags, cfg, known))}"
            for i in seeds:
                argv = [*flags, "-go", goal, "-pv", str(i), "-t", str(i + 1), "--results_dir", str(out),
                        "--checkpoint_every", str(checkpoint_every), "--resume", "--no-progress"]
                stem = main.result_stem(cfg.replace(goal=goal), i)
                jobs.append(Job(argv, stem, out, cfg.global_rounds, point))
    by_stem: dict[str, Job] = {}
    for job in jobs:
        if job.stem in by_stem:
            other = by_stem[job.stem]
            raise SweepError(f"two jobs would write {job.stem}.h5 (grid points {other.grid_point} and "
                             f"{job.grid_point} give the same configuration); remove one")
        by_stem[job.stem] = job
    return jobs, invalid


# ---- running ------------------------------------------------------------------------------------------
def sidecar_status(job: Job) -> str | None:
    """The run's ``status`` from its sidecar (running, finished, diverged, interrupted, failed), if any."""
    from utils.results import sidecar_status as read

    return read(job.h5.with_suffix(".json"))


def is_complete(job: Job, exported: frozenset = frozenset()) -> bool:
    """The result file holds every evaluation (its last one is round ``-gr``, the final evaluation), or
    its sidecar says the run ended for good: finished (e.g. stopped early by ``-ab``) or diverged (a rerun
    would diverge again: every draw is seeded), or the sweep's export holds the run (``exported``)."""
    if job.key in exported:
        return True
    if not job.h5.exists():
        return False
    from utils.results import read_h5

    try:
        rounds = read_h5(job.h5).get("rs_round", [])
    except OSError:
        return False
    return (len(rounds) > 0 and int(rounds[-1]) == job.gr) or sidecar_status(job) in ("finished", "diverged")


def run_job(job: Job, keep_checkpoints: bool, threads: int = 0) -> tuple[int, str]:
    """Run one job to its end; returns (exit code, note). The job's log is locked while it runs, so a
    second sweep over the same folder leaves it alone."""
    logs = fileio.Folder(job.out, what="sweep --out").sub("logs")
    with logs.open_append(job.log.name) as log:
        try:
            fcntl.flock(log, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 75, "running in another process"
        resumed = job.ckpt.exists()
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {'resume' if resumed else 'start'}: {job.shown()}\n")
        log.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if threads:  # parallel jobs share the cores instead of each taking all of them
            env.setdefault("OMP_NUM_THREADS", str(threads))
        proc = subprocess.Popen(job.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # the exit status and this child's own resource usage
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime  # the job and its worker processes
        log.write(f"# exit {proc.returncode}, {cpu:.1f} CPU-s\n")
        add_cpu_seconds(job, cpu)
    if proc.returncode == 0 and not keep_checkpoints:
        fileio.Folder(job.out, what="sweep --out").remove(job.ckpt.name)  # the job's own checkpoint, by name
    return proc.returncode, "resumed" if resumed else ""


def add_cpu_seconds(job: Job, seconds: float) -> None:
    """Add one attempt's CPU time (user + system, of the job and every process it waited for) to
    ``<out>/logs/<result name>.cpu.json``: what a sweep costs, whatever else ran on the machine."""
    path = job.log.with_suffix(".cpu.json")
    folder = fileio.Folder(path.parent, what="sweep log folder")
    try:
        spent = folder.read_json(path.name, "CPU record")
    except FLError:
        spent = None
    if not (isinstance(spent, dict) and isinstance(spent.get("cpu_s"), (int, float))
            and isinstance(spent.get("attempts"), int) and math.isfinite(spent["cpu_s"])):
        spent = {"cpu_s": 0.0, "attempts": 0}  # absent, or not a record this sweep wrote: start it again
    spent = {"cpu_s": round(spent["cpu_s"] + seconds, 2), "attempts": spent["attempts"] + 1}
    folder.replace([(path.name, lambda f: f.write((json.dumps(spent) + "\n").encode()))])


def cpu_seconds(job: Job) -> float | None:
    """The CPU seconds recorded for ``job`` over all its attempts (None when none was recorded)."""
    try:
        return float(fileio.read_json(job.log.with_suffix(".cpu.json"), "CPU record", follow=False)["cpu_s"])
    except (FLError, ValueError, KeyError, TypeError):
        return None


def run_jobs(jobs: list[Job], workers: int, keep_checkpoints: bool = False, progress: bool = True,
             exported: frozenset = frozenset()) -> list:
    """Run the incomplete jobs, ``workers`` at a time; returns the failures as (job, exit code)."""
    from tqdm import tqdm

    todo = [j for j in jobs if not is_complete(j, exported)]
    skipped = len(jobs) - len(todo)
    print(f"sweep: {len(jobs)} jobs, {skipped} complete (skipped), {len(todo)} to run with {workers} "
          f"process(es)", file=sys.stderr)
    bar = tqdm(total=len(jobs), initial=skipped, unit="job", desc="sweep", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    failures = []

    threads = max(1, (os.cpu_count() or 1) // workers) if workers > 1 else 0
    stop = threading.Event()  # Ctrl-C: no further job starts

    def one(job):
        if stop.is_set():
            return job, None, ""
        code, note = run_job(job, keep_checkpoints, threads)
        return job, code, note

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        try:
            for fut in as_completed([pool.submit(one, job) for job in todo]):
                job, code, note = fut.result()
                if code is None:
                    continue
                if code != 0 and sidecar_status(job) == "diverged":
                    bar.write(f"diverged (kept as its result): {job.shown()}\n  log: {job.log}", file=sys.stderr)
                elif code != 0:
                    failures.append((job, code))
                    reason = note or f"exit code {code}"
                    bar.write(f"FAILED ({reason}): {job.shown()}\n  log: {job.log}", file=sys.stderr)
                bar.update(1)
                bar.set_postfix(failed=len(failures), refresh=False)
        except KeyboardInterrupt:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            bar.close()
    return failures


def prepare_splits(jobs: list[Job]) -> None:
    """Generate missing offline splits (Digits, Synthetic) once, before parallel jobs could race on them."""
    import main

    done = set()
    for job in jobs:
        cfg, _ = parse_job_flags(job.argv)
        if cfg is not None and (cfg.dataset, cfg.dataset_root) not in done:
            done.add((cfg.dataset, cfg.dataset_root))
            main.ensure_split(cfg)


# ---- command line ---------------------------------------------------------------------------------------
# A sweep file's schema: key -> the type its value must have (and what it holds).
SWEEP_KEYS = {"base": list, "grids": list, "per_algorithm": dict, "seeds": (list, str, int), "tag": str, "out": str,
              "checkpoint_every": int, "description": str, "export": str}


def load_config_file(path: Path) -> dict:
    """A sweep file (JSON, through utils/fileio.py: a regular file, capped in size and depth), its schema
    checked: known keys, each of its type; ``base`` a list of flags, ``grids`` a list of objects flag ->
    value or list of values."""
    try:
        spec = fileio.read_json(path, "sweep file")
    except FLError as e:
        raise SweepError(f"cannot read {' '.join(str(e).split())}") from None
    if not isinstance(spec, dict):
        raise SweepError(f"sweep file {path} is not a JSON object")
    spec = {k: v for k, v in spec.items() if v is not None}  # null: the key's default
    unknown = set(spec) - set(SWEEP_KEYS)
    if unknown:
        raise SweepError(f"{path}: unknown keys {sorted(unknown)} (known: {', '.join(sorted(SWEEP_KEYS))})")
    scalar = (str, int, float, bool)
    for key, kind in SWEEP_KEYS.items():
        value = spec.get(key)
        if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and bool not in (
                kind if isinstance(kind, tuple) else (kind,)))):
            raise SweepError(f"{path}: '{key}' is a {type(value).__name__}, not a {getattr(kind, '__name__', 'list')}")
    if not all(isinstance(a, scalar) for a in spec.get("base", [])):
        raise SweepError(f"{path}: 'base' must list flags and values (strings or numbers)")
    for g in spec.get("grids", []):
        if not isinstance(g, dict) or not all(isinstance(v, scalar) or (isinstance(v, list) and all(
                isinstance(e, scalar) for e in v)) for v in g.values()):
            raise SweepError(f"{path}: each of 'grids' must map a flag to a value or a list of values")
    return spec


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip() != ""]
    except ValueError:
        raise SweepError(f"--seeds '{text}' is not a comma-separated list of run indices") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds '{text}': give distinct run indices >= 0")
    return seeds


def sweep_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False, usage="%(prog)s [sweep options] [--grid FLAG=v1,v2 ...] "
                                                          "[flags for every job]")
    p.add_argument("--config", type=Path, default=None, help="JSON sweep file (base, grids, seeds, tag, out)")
    p.add_argument("--grid", metavar="FLAG=v1,v2", help="grid items (repeatable after one --grid)")
    p.add_argument("--seeds", default=None, help="run indices, comma-separated (default 0); seed = --seed + index")
    p.add_argument("--tag", default=None, help="readable part of every job's -go (default: sweep)")
    p.add_argument("--out", type=Path, default=None, help="results folder of the sweep (default: results/sweep)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="jobs run in parallel")
    p.add_argument("--dry-run", action="store_true", help="print the job commands and their state; run nothing")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep a finished job's .ckpt")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="rounds between a job's checkpoints (default: the file's checkpoint_every, else 1)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--export", type=Path, default=None,
                   help="a benchmark export whose finished runs count as complete (default: the file's export)")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    grid_items, rest = split_grid_args(argv)
    args, base_cli = sweep_parser().parse_known_args(rest)
    try:
        spec = load_config_file(args.config) if args.config else {}
        cli_grid = parse_grid_items(grid_items)
        file_grids = [{k: v for k, v in g.items()} for g in spec.get("grids", [])] or [{}]
        grids = [{**g, **cli_grid} for g in file_grids]
        base = [str(a) for a in spec.get("base", [])] + base_cli
        seeds = parse_seeds(args.seeds if args.seeds is not None else ",".join(map(str, spec.get("seeds", [0]))))
        tag = args.tag or spec.get("tag") or "sweep"
        if not tag.replace("-", "").replace(".", "").replace("+", "").isalnum() or "_" in tag:
            raise SweepError(f"--tag '{tag}': use letters, digits, '-', '.' or '+' (it is part of file names)")
        # --out is relative to the working directory, the file's "out" and the default to the repository
        out = args.out if args.out is not None else REPO / spec.get("out", "results/sweep")
        if args.jobs < 1:
            raise SweepError("-j must be >= 1")
        every = args.checkpoint_every if args.checkpoint_every is not None else spec.get("checkpoint_every", 1)
        if not isinstance(every, int) or every < 1:
            raise SweepError(f"checkpoint every {every!r} rounds: give an integer >= 1")
        out = out.resolve()
        if out.is_relative_to(Path.cwd()):  # shorter commands and messages; jobs run in this folder
            out = out.relative_to(Path.cwd())
        jobs, invalid = build_jobs(base, grids, seeds, tag, out, spec.get("per_algorithm"), every)
        export = args.export if args.export is not None else (REPO / spec["export"] if "export" in spec else None)
        exported = exported_runs(export)
    except (SweepError, FLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for flags, error in invalid:
        print(f"REFUSED (main.py: {error}): python system/main.py {' '.join(shlex.quote(a) for a in flags)}",
              file=sys.stderr)
    if args.dry_run:
        for job in jobs:
            state = ("exported" if job.key in exported else "complete" if is_complete(job) else
                     "resume" if job.ckpt.exists() else "new")
            print(f"[{state}] {job.shown()}")
        print(f"{len(jobs)} jobs ({sum(is_complete(j, exported) for j in jobs)} complete), {len(invalid)} refused; "
              f"results in {out}", file=sys.stderr)
        return 1 if invalid else 0
    prepare_splits(jobs)
    try:
        failures = run_jobs(jobs, args.jobs, args.keep_checkpoints, args.progress, exported)
    except KeyboardInterrupt:
        print("sweep interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except FLError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for job, code in failures:
        print(f"failed (exit {code}): {job.shown()}\n  log: {job.log}", file=sys.stderr)
    done = len(jobs) - len(failures)
    print(f"sweep: {done}/{len(jobs)} jobs complete, {len(failures)} failed, {len(invalid)} refused; results in "
          f"{out}", file=sys.stderr)
    return 1 if failures or invalid else 0


if __name__ == "__main__":
    sys.exit(main())
