"""Run federated learning experiments from the command line.

    python system/main.py -data MNIST -m CNN -algo FedAvg -gr 5 -dev cpu
    python system/main.py -data Digits -algo FedALA -gr 20 -t 3

Flags keep PFLlib's short names. ``-algo`` picks a server class from the registry; its own flags are added
once it is known (``python system/main.py -algo FedALA -h`` lists them). Each run writes
``results/<data>_<algo>_<goal>_<run>.h5`` and a ``.json`` sidecar; ``-t N`` runs N seeds (run i uses
seed + i) and prints mean ± std of the best and last accuracy.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# python system/main.py and cd system && python main.py both put system/ first on the path: no path edit here.
import cli
from flcore.registry import get_server_class
from utils.config import Config
from utils.errors import Diverged, FLError, Interrupted
from utils.paths import GENERATORS_DIR, OFFLINE_GENERATORS


def resolve_device(cfg: Config) -> Config:
    import torch

    if cfg.device == "cpu":
        return cfg
    if not torch.cuda.is_available():
        if cfg.device == "cuda":
            print("WARNING: -dev cuda but no CUDA device is available; running on the CPU", file=sys.stderr)
        return cfg.replace(device="cpu")
    return cfg.replace(device=f"cuda:{cfg.device_id.split(',')[0]}")


def generatable(cfg: Config) -> Path | None:
    """The generator a missing split is made with by default: Digits and Synthetic need nothing, a dataset
    with a generator needs ``--source``; None when the run cannot make it."""
    if cfg.dataset in OFFLINE_GENERATORS:
        return GENERATORS_DIR / OFFLINE_GENERATORS[cfg.dataset]
    if cfg.source and (GENERATORS_DIR / f"generate_{cfg.dataset}.py").exists():
        return GENERATORS_DIR / f"generate_{cfg.dataset}.py"
    return None


def resolve_split(cfg: Config) -> Config:
    """Before anything else is checked: ``-data`` spelled in another case names the split or generator of that
    name (``-data digits`` runs ``Digits``), and a split that is neither on disk nor generatable here is
    reported as missing, with the command that makes it."""
    from utils.data_utils import missing_split

    root = Path(cfg.dataset_root)
    if not os.path.lexists(root / cfg.dataset):
        on_disk = [d.name for d in root.iterdir() if (d / "config.json").is_file()] if root.is_dir() else []
        known = [*on_disk, *OFFLINE_GENERATORS,
                 *(f.stem[len("generate_"):] for f in GENERATORS_DIR.glob("generate_*.py"))]
        same = sorted({k for k in known if k.lower() == cfg.dataset.lower()})
        if len(same) == 1 and same[0] != cfg.dataset:
            print(f"-data {cfg.dataset}: using split '{same[0]}'")
            cfg = cfg.replace(dataset=same[0])
    folder = root / cfg.dataset
    if os.path.lexists(folder) and not folder.is_dir():
        raise FLError(f"split folder {folder} is not a folder (a file, a broken symlink or a symlink loop); "
                      f"remove it or choose another --dataset_root")
    if not (folder / "config.json").exists() and generatable(cfg) is None:
        raise missing_split(cfg.dataset, root)
    return cfg


def ensure_split(cfg: Config) -> None:
    """Generate a missing split with default settings when its data is offline: Digits, Synthetic, or a
    dataset with a generator and ``--source``. The generator's per-client table is left out (the split's
    folder keeps it: ``config.json``); its summary lines are printed, and all of its output if it fails."""
    root = Path(cfg.dataset_root)
    if (root / cfg.dataset / "config.json").exists() or (script := generatable(cfg)) is None:
        return
    extra = ["--source", cfg.source] if cfg.dataset not in OFFLINE_GENERATORS else []
    cmd = [str(script), "--root", str(root), "--out", cfg.dataset, *extra]
    print(f"split '{cfg.dataset}' is missing; generating it with default settings: python {' '.join(cmd)}")
    done = subprocess.run([sys.executable, *cmd], capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr, end="", file=sys.stderr)
        raise FLError(f"generating split '{cfg.dataset}' failed (see the message above)")
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith(("wrote ", "total: "))))


def provenance(server) -> dict:
    """What a result file says about how it was made, beyond the flags: the model actually built (and with
    --client_models each client's architecture), the library's commit (when run from a git checkout) and the torch version."""
    import torch

    repo = Path(__file__).resolve().parents[1]
    commit = None
    try:
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if done.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            commit = done.stdout.strip() + ("+local-changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    model = server.global_model
    built = {"model_built": type(model).__name__, "model_parameters": sum(p.numel() for p in model.parameters())}
    if server.client_model_names is not None:  # --client_models: each client's architecture, by id
        built["client_models_built"] = list(server.client_model_names)
    return {**built, "git_commit": commit, "torch_version": torch.__version__}


def summary_line(cfg: Config, server, built: dict) -> str:
    """The start-up line: what runs on what, the model actually built (``-m auto`` resolved), whether ALA
    initialises the clients, the schedule and where it runs (``--print_config`` lists every setting)."""
    ala = bool(cfg.ala or server.declares.client_class.declares.use_ala)
    model = built["model_built"] + (" (per client: --client_models)" if "client_models_built" in built else "")
    runs = f", runs {cfg.prev}-{cfg.times - 1}" if cfg.times - cfg.prev > 1 else ""
    return (f"{label(cfg)} on {cfg.dataset} ({cfg.num_clients} clients, {cfg.num_classes} classes): model {model} "
            f"({built['model_parameters'] / 1e6:.3g} M parameters), ALA {'on' if ala else 'off'}, "
            f"-gr {cfg.global_rounds} -ls {cfg.local_epochs} -lbs {cfg.batch_size} -lr {cfg.local_learning_rate} "
            f"-jr {cfg.join_ratio}{runs}, executor {cfg.executor} on {cfg.device} (--print_config: every setting)")


def label(cfg: Config) -> str:
    return cfg.algorithm + ("+ALA" if cfg.ala and cfg.algorithm != "FedALA" else "")


def result_stem(cfg: Config, run: int) -> str:
    """Run ``run``'s result file name without extension: ``<dataset>_<label>_<goal>_<run>``."""
    return f"{cfg.dataset}_{label(cfg)}_{cfg.goal}_{run}"


def refuse_existing(cfg: Config, runs=None) -> None:
    """A run whose result file exists is refused (unless --overwrite or --resume), naming the flags that
    proceed and a free -go tag. main.run checks every run before any work; run_all checks each again once
    it holds the result name's lock."""
    if cfg.overwrite or cfg.resume:
        return
    runs = range(cfg.prev, cfg.times) if runs is None else runs
    out = cli.results_folder(cfg)
    taken = [out / f"{result_stem(cfg, r)}.h5" for r in runs if (out / f"{result_stem(cfg, r)}.h5").exists()]
    if taken:
        free = next(f"{cfg.goal}{k}" for k in itertools.count(2)
                    if not any((out / f"{result_stem(cfg.replace(goal=f'{cfg.goal}{k}'), r)}.h5").exists() for r in runs))
        raise FLError(f"{taken[0]} already exists; pass --overwrite to replace it, --resume to continue it, or "
                      f"-go {free} to keep both")


def set_up(cfg: Config):
    """What a run needs before its server, for main.py and every script that builds one (scripts/run/benchmark.py):
    the device resolved, ``--amp`` checked against it, the split generated when missing and loaded (with its
    checks), its class count checked against ``-ncl``. Returns (cfg with the split's class and client counts,
    the split)."""
    from utils.data_utils import load_split

    cfg = resolve_device(cfg)
    if cfg.amp == "fp16" and cfg.device == "cpu":
        raise FLError("--amp fp16 needs a CUDA device; on the CPU use --amp bf16")
    ensure_split(cfg)
    # Ray workers receive CPU copies and move them to their own device.
    data = load_split(cfg.dataset, cfg.dataset_root, cfg.num_clients, "cpu" if cfg.executor == "ray" else cfg.device,
                      cfg.num_new_clients)
    if cfg.num_classes is not None and cfg.num_classes != data.num_classes:
        raise FLError(f"-ncl {cfg.num_classes} but split '{cfg.dataset}' has {data.num_classes} classes")
    return cfg.replace(num_classes=data.num_classes, num_clients=len(data.clients)), data


def run(cfg: Config, executor=None) -> list[Path]:
    """All runs of one configuration; returns the result files written. The runs share one executor
    (workers start once): ``executor`` if given (the caller closes it), else one made from the flags."""
    from runtime.choose import executor_kind, make_executor

    cfg = resolve_split(cfg)  # a missing split is reported as missing, before any result is looked at
    refuse_existing(cfg)  # before the split is generated or loaded
    cfg, data = set_up(cfg)
    # The executor that really runs (--executor auto resolved, or the one given), so the results say which.
    client_class = get_server_class(cfg.algorithm).declares.client_class  # whether it batches (--executor auto on CUDA)
    auto = cfg.executor == "auto"
    cfg = cfg.replace(executor=executor.name if executor is not None else executor_kind(cfg, client_class))
    if cfg.print_config:
        cli.print_config(cfg)
    if executor is not None:
        return run_all(cfg, data, executor)
    executor = make_executor(cfg, client_class, auto)
    try:
        return run_all(cfg, data, executor)
    finally:
        executor.close()


def unfinished(sidecar: Path) -> bool:
    """Whether a result's sidecar says its run stopped before its end: interrupted by a signal, or still
    "running" although its process is gone (the caller holds the result name's lock). ``--resume`` without a
    checkpoint starts such a run over, since every round it lost is recomputed the same; a finished, diverged
    or failed result is an outcome and is never replaced that way."""
    from utils.results import sidecar_status

    return sidecar_status(sidecar) in ("interrupted", "running")


def run_all(cfg: Config, data, executor) -> list[Path]:
    import torch

    from runtime.checkpoint import checkpoint_file
    from utils.results import RunRecorder, mean_std_over_runs, save_files

    server_cls = get_server_class(cfg.algorithm)
    out_dir = cli.results_folder(cfg)
    paths = []
    for r in range(cfg.prev, cfg.times):
        meta = {"config": cfg.to_dict(), "run": r, "seed": cfg.seed + r, "label": label(cfg),
                "split": {"name": data.name, "config_hash": data.config_hash,
                          "source_sha256": data.config.get("source_sha256")},
                **({"config_file": {"path": cfg.config, "values": cli.read_config_file(cfg.config)}} if cfg.config else {})}
        recorder = RunRecorder(result_stem(cfg, r), meta, out_dir)
        # folders inside the results folder, every component a real folder (utils/fileio.py)
        saved_models = recorder.folder.sub(cfg.save_folder_name, what="-sfn") if cfg.save_folder_name else None
        if cfg.tensorboard:
            recorder.log_to_tensorboard(recorder.folder.sub(Path(cfg.tensorboard) / recorder.stem,
                                                            what="--tensorboard").path)
        start = time.time()
        with recorder.lock():
            if recorder.h5_path.exists() and not cfg.overwrite:
                refuse_existing(cfg, [r])  # without --resume: a run that started meanwhile may have written it
                if not checkpoint_file(recorder).exists() and not unfinished(recorder.json_path):
                    raise FLError(f"--resume: {recorder.h5_path} exists but has no checkpoint "
                                  f"({checkpoint_file(recorder).name}) to continue from; pass --overwrite to run "
                                  f"it again, or another -go to keep both")
            server = server_cls(cfg, data, r, recorder, executor=executor)
            recorder.meta.update(provenance(server))
            if r == cfg.prev:
                print(summary_line(cfg, server, recorder.meta))
            train_and_record(cfg, server, recorder)
        best, last = recorder.best_last()
        print(f"run {r}: best acc {best:.4f}, last acc {last:.4f}, {time.time() - start:.1f} s, "
              f"{recorder.h5_path} (+ {recorder.json_path.name})")
        if saved_models is not None:
            state = server.global_model.state_dict()
            save_files(saved_models, [(f"{recorder.stem}_server.pt", lambda f: torch.save(state, f))])
        paths.append(recorder.h5_path)
    if len(paths) > 1:
        s = mean_std_over_runs(paths)
        print(f"{s['runs']} runs: best {100 * s['best_mean']:.2f} ± {100 * s['best_std']:.2f}, "
              f"last {100 * s['last_mean']:.2f} ± {100 * s['last_std']:.2f}")
    return paths


def train_and_record(cfg: Config, server, recorder) -> None:
    """``runtime.loop.train(server)``, with how it ended recorded in the sidecar's ``status``: finished, diverged (a
    non-finite loss), failed (another error with a message) or interrupted (Ctrl-C / SIGTERM; the rounds
    evaluated so far are kept and the message says how to resume)."""
    from runtime import loop

    try:
        loop.train(server)
    except Diverged as e:
        recorder.finish("diverged", str(e))
        raise
    except FLError as e:
        recorder.finish("failed", str(e))
        raise
    except KeyboardInterrupt:
        recorder.finish("interrupted", f"stopped by a signal in round {server.round_idx}")
        done = len(recorder.series.get("rs_round", []))
        resume = ("rerun the same command with --resume to continue from the last checkpoint"
                  if cfg.checkpoint_every else "add --checkpoint_every N to make a run resumable")
        raise Interrupted(f"interrupted in round {server.round_idx}; {done} evaluation(s) kept in "
                          f"{recorder.h5_path}; {resume}") from None
    except Exception as e:
        from runtime.checkpoint import blame

        misfit = blame(server, e)  # a resumed run: the error comes from its checkpoint's values
        recorder.finish("failed", str(misfit) if misfit else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if misfit is not None:
            raise misfit from None
        raise
    # each client's local training time, one entry per round it trained (the cost side of a table)
    recorder.meta["client_train_time_s"] = [list(c.train_time) for c in server.clients]
    if cfg.global_rounds == 0:  # the initial model evaluated: scripts/run/table.py leaves it out unless --untrained
        recorder.meta["untrained"] = True
    recorder.finish("finished")


def main(argv=None) -> int:
    import signal

    from utils import results

    # SIGTERM ends a run as Ctrl-C does; neither interrupts the writing of a result file. The exit code is
    # 128 + the signal: 130 for Ctrl-C (SIGINT), 143 for SIGTERM.
    results.reset_interrupt()
    interrupt = results.interrupt
    previous = {}
    if threading.current_thread() is threading.main_thread():  # handlers can only be set there
        previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        cfg = cli.parse_config(argv)
        run(cfg)
    except FLError as e:
        print("error: " + " ".join(str(e).split("\n")), file=sys.stderr)  # one line, whatever the message holds
        return 128 + (results.stopped_by() or signal.SIGINT) if isinstance(e, Interrupted) else 2
    except KeyboardInterrupt:  # before any run started
        print("error: interrupted", file=sys.stderr)
        return 128 + (results.stopped_by() or signal.SIGINT)
    except (RuntimeError, MemoryError) as e:
        if type(e).__name__ == "OutOfMemoryError":
            print(f"error: out of GPU memory ({str(e).splitlines()[0]}); try --client_state cpu (only a round's "
                  f"clients stay on the GPU), a smaller -lbs or --eval_batch_size, or --amp bf16", file=sys.stderr)
        elif isinstance(e, MemoryError) or "can't allocate memory" in str(e):
            print("error: out of memory; check the split's num_classes / input_shape and the model size, or try "
                  "--client_state cpu or disk (only a round's clients stay in memory)", file=sys.stderr)
        else:
            raise
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        results.reset_interrupt()  # the exit code has read it; a later loop in this process starts clean
    return 0


if __name__ == "__main__":
    # main() restores the handlers it found when it returns; as a program, those ignore a Ctrl-C or SIGTERM
    # repeated while the process exits, so a run stopped by a signal ends with its one line and 130 / 143
    import signal

    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, signal.SIG_IGN)
    sys.exit(main())
