"""Experiment driver for docs/fedala_reproduction.md: the FedALA paper's claims at CPU scale.

    python scripts/fedala_experiments.py run               # CPU scale (defaults below), resumable
    python scripts/fedala_experiments.py report            # tables + learning curves -> docs/
    python scripts/fedala_experiments.py run --rounds 2000 --runs 5 --subsample 0 --lr 0.005   # paper scale

Groups (``--groups``): ``main`` (FedAvg, FedProx, FedALA, FedProx+ALA, Local on MNIST pathological,
FMNIST Dir(0.1), CIFAR-10-partial Dir(0.1)), ``hetero`` (FedAvg vs FedALA on FMNIST Dir(alpha) for ``--hetero_alphas``, default 0.05 and 0.5:
Dir(0.01) over FMNIST's 10 classes and 20 clients leaves clients empty, so no draw meets a minimum size),
``baselines`` (every method on FMNIST and CIFAR-10 Dir(0.1), with "+ALA" for the plug-in ones; run it
into its own ``--results`` folder when it uses other ``--rounds`` than the main group), ``sens`` (FedALA on FMNIST Dir(0.1) with p in {2, all} and s in {5, 20, 100}; p=1, s=80 is the main run).
Every run is one ``system/main.py`` process; finished runs are skipped, so an interrupted sweep resumes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The FedALA paper's comparison beyond the main group's FedAvg, FedProx, FedALA, Local, FedProx+ALA.
BASELINES = ["FedAvg-C", "FedProx-C", "Per-FedAvg", "FedRep", "pFedMe", "Ditto", "FedAMP", "FedPHP", "FedFomo",
             "APPLE", "PartialFed"]
# Settings the FedALA paper fixes for its comparison: FedFomo downloads M = 20 models per round (APPLE
# downloads all N = 20 clients' cores here by construction).
PAPER_FLAGS = {"FedFomo": ["-M", "20"]}
ALA_PLUGINS = ["Per-FedAvg", "FedRep", "pFedMe", "Ditto", "FedAMP", "FedPHP", "PartialFed"]
SOURCES = {"MNIST": "mnist.npz", "FashionMNIST": "fmnist.npz", "Cifar10": "cifar10_partial.npz"}


def split_specs(args) -> dict[str, tuple[str, list[str]]]:
    """Split name -> (generator dataset, generator flags)."""
    sub = [] if not args.subsample else ["--subsample", str(args.subsample)]
    tag = f"_s{args.subsample}" if args.subsample else ""
    common = ["--num-clients", "20", "--seed", "1", "--least-samples", str(args.least_samples), *sub]
    specs = {f"MNIST_pat{tag}": ("MNIST", ["--partition", "pat", "--class-per-client", "2", *common]),
             f"Cifar10_dir0.1{tag}": ("Cifar10", ["--partition", "dir", "--alpha", "0.1", *common])}
    for alpha in {"0.1", *args.hetero_alphas}:
        specs[f"FMNIST_dir{alpha}{tag}"] = ("FashionMNIST", ["--partition", "dir", "--alpha", alpha, *common])
    return specs


def plan(args) -> list[tuple[str, str, str, list[str]]]:
    """(group, split, goal, main.py flags) for every run, in the order they are run."""
    tag = f"_s{args.subsample}" if args.subsample else ""
    main_splits = [f"MNIST_pat{tag}", f"FMNIST_dir0.1{tag}", f"Cifar10_dir0.1{tag}"]
    algos = [("FedAvg", []), ("FedALA", []), ("Local", []), ("FedProx", []), ("FedProx", ["-ala"])]
    runs = []
    if "main" in args.groups:
        runs += [("main", s, "repro", ["-algo", a, *f]) for a, f in algos for s in main_splits]
    if "hetero" in args.groups:
        runs += [("hetero", f"FMNIST_dir{al}{tag}", "repro", ["-algo", a])
                 for al in args.hetero_alphas for a in ("FedAvg", "FedALA")]
    if "baselines" in args.groups:
        for split in (f"FMNIST_dir0.1{tag}", f"Cifar10_dir0.1{tag}"):
            runs += [("baselines", split, "repro", ["-algo", a, *PAPER_FLAGS.get(a, [])])
                     for a in ["FedAvg", "FedProx", *BASELINES, "Local"]]
            runs += [("baselines", split, "repro", ["-algo", a, "-ala"]) for a in ["FedProx"]]
            runs += [("baselines", split, "repro", ["-algo", "FedALA"])]
            runs += [("baselines", split, "repro", ["-algo", a, "-ala"]) for a in ALA_PLUGINS]
    if "sens" in args.groups:
        runs += [("sens", f"FMNIST_dir0.1{tag}", f"p{p}", ["-algo", "FedALA", "--ala_layers", p])
                 for p in ("2", "0")]
        runs += [("sens", f"FMNIST_dir0.1{tag}", f"s{s}", ["-algo", "FedALA", "-s", s]) for s in ("5", "20", "100")]
    return runs


def result_stem(split: str, flags: list[str], goal: str, run: int) -> str:
    """The result name system/main.py gives this run (its own ``result_stem``, from the same flags)."""
    if str(REPO / "system") not in sys.path:
        sys.path.insert(0, str(REPO / "system"))
    import main

    return main.result_stem(main.parse_config(["-data", split, "-go", goal, *flags]), run)


def finished(out: Path, stem: str, rounds: int) -> bool:
    meta = out / f"{stem}.json"
    return meta.exists() and json.loads(meta.read_text()).get("evaluations") == rounds + 1


def make_splits(args) -> None:
    needed = {s for _, s, _, _ in plan(args)}
    for split, (dataset, flags) in split_specs(args).items():
        if split in needed:
            src = Path(args.data) / SOURCES[dataset]
            subprocess.run([sys.executable, str(REPO / "dataset" / f"generate_{dataset}.py"), *flags, "--out",
                            split, "--source", str(src)], check=True, stdout=subprocess.DEVNULL)


def cmd_run(args) -> None:
    """Run this queue's share of the unfinished runs (every jobs-th, from job_index)."""
    out = REPO / args.results
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    todo = [(g, s, goal, f, r) for g, s, goal, f in plan(args) for r in range(args.runs)
            if not finished(out, result_stem(s, f, goal, r), args.rounds)]
    for group, split, goal, flags, run in todo[args.job_index::args.jobs]:
        stem = result_stem(split, flags, goal, run)
        cmd = [sys.executable, str(REPO / "system" / "main.py"), "-data", split, "-m", "CNN", "-gr",
               str(args.rounds), "-lr", str(args.lr), "-lbs", "10", "-ls", "1", "-go", goal, "-pv", str(run),
               "-t", str(run + 1), "--results_dir", str(out), "--no-progress", "-dev", args.device,
               "--train_loss_eval", args.train_loss_eval, "--overwrite", *flags]  # an unfinished run starts over
        start = time.time()
        print(f"[{group}] {stem}: {' '.join(cmd[2:])}", flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        print(f"    rc {done.returncode} in {time.time() - start:.0f} s: {tail[0]}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "report"])
    p.add_argument("--groups", default="main,hetero,sens,baselines", help="comma-separated: main, hetero, sens, baselines")
    p.add_argument("--rounds", type=int, default=10, help="communication rounds (paper: 2000)")
    p.add_argument("--runs", type=int, default=1, help="runs (seeds 0..runs-1; paper: 5)")
    p.add_argument("--subsample", type=int, default=2000, help="samples kept per dataset (0 = all)")
    p.add_argument("--lr", type=float, default=0.05, help="client lr (paper: 0.005 for 2000 rounds)")
    p.add_argument("--train_loss_eval", default="off", choices=["full", "off"])
    p.add_argument("--hetero_alphas", default="0.05,0.5", help="Dirichlet alphas of the hetero group")
    p.add_argument("--least_samples", type=int, default=20, help="minimum client size of the splits")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--jobs", type=int, default=1, help="run this many queues in parallel")
    p.add_argument("--job_index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="folder of the source npz files")
    p.add_argument("--results", default="results/fedala_repro", help="results folder (relative to the repo)")
    args = p.parse_args(argv)
    args.groups = args.groups.split(",")
    args.hetero_alphas = args.hetero_alphas.split(",")
    if args.command == "run" and args.job_index is None:
        make_splits(args)
    if args.command == "run" and args.job_index is None and args.jobs > 1:
        queues = [subprocess.Popen([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                                    "--job_index", str(i)]) for i in range(args.jobs)]
        raise SystemExit(max(q.wait() for q in queues))
    if args.command == "run":
        args.job_index = args.job_index or 0
        cmd_run(args)
    else:
        sys.path.insert(0, str(REPO / "scripts"))
        from fedala_report import write_report

        write_report(args, plan(args), result_stem)


if __name__ == "__main__":
    main()
