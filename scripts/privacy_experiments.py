"""Experiment driver for docs/privacy.md: DLG / iDLG against FedAvg, FedALA and FedRep, with and without DP-SGD.

    python scripts/privacy_experiments.py run        # sequential, resumable (finished runs are skipped)
    python scripts/privacy_experiments.py report     # prints the tables; copies the grids to docs/img/

Scale (CPU): 20 clients, Dir(0.1), 6,000 images subsampled per dataset (seed 1), the 4-layer CNN, batch 10,
one local epoch, lr 0.05, seed 0. Attacks: rounds 0 and 2 of a 3-round run (-dlgg 2), 2 clients per
attacked round, one batch of one image each (-bnpc 1, --dlg_batch 1), 200 L-BFGS iterations.
Groups: ``attack`` (the textbook gradient: DLG and iDLG against FedAvg, FedALA and FedRep on MNIST; iDLG
against FedAvg on CIFAR-10), ``update`` (iDLG on what each algorithm uploads; FedAvg only on CIFAR-10) and
``dp`` (FedAvg with DP-SGD at two noise levels: iDLG on the DP-SGD gradient, accuracy and epsilon).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = {"MNIST_dir0.1_s6000": ("MNIST", "mnist.npz"), "Cifar10_dir0.1_s6000": ("Cifar10", "cifar10_partial.npz")}
ALGOS = ("FedAvg", "FedALA", "FedRep")
SIGMAS = ("0.1", "1.0")
ATTACK = ["-gr", "3", "-dlg", "-dlgg", "2", "--dlg_clients", "2", "-bnpc", "1", "--dlg_iters", "200"]


def plan(groups: list[str]) -> list[tuple[str, str, str, list[str]]]:
    """(group, split, goal, flags) of every run, in order. Within the ~40 CPU-minute budget of the report,
    CIFAR-10 gets FedAvg only; the DP runs double as the accuracy-cost measurement (the attack works on
    copies and its own random streams, so it never changes training)."""
    mnist, cifar = SPLITS
    idlg = [*ATTACK, "--dlg_attack", "idlg"]
    runs = []
    if "attack" in groups:
        runs += [("attack", mnist, f"{a}-gradient", ["-algo", algo, *ATTACK, "--dlg_attack", a])
                 for algo in ALGOS for a in ("dlg", "idlg")]
        runs += [("attack", cifar, "idlg-gradient", ["-algo", "FedAvg", *idlg])]
    if "update" in groups:
        runs += [("update", mnist, "idlg-update", ["-algo", algo, *idlg, "--dlg_target", "update"]) for algo in ALGOS]
        runs += [("update", cifar, "idlg-update", ["-algo", "FedAvg", *idlg, "--dlg_target", "update"])]
    if "dp" in groups:
        runs += [("dp", mnist, f"idlg-gradient-dp{s}", ["-algo", "FedAvg", *idlg, "-dp", "-dps", s]) for s in SIGMAS]
    return runs


def stem(split: str, flags: list[str], goal: str) -> str:
    return f"{split}_{flags[flags.index('-algo') + 1]}_{goal}_0"


def make_splits(data: Path) -> None:
    for split, (dataset, source) in SPLITS.items():
        subprocess.run([sys.executable, str(REPO / "dataset" / f"generate_{dataset}.py"), "--partition", "dir",
                        "--alpha", "0.1", "--num-clients", "20", "--subsample", "6000", "--seed", "1",
                        "--source", str(data / source), "--out", split], check=True, stdout=subprocess.DEVNULL)


def cmd_run(args) -> None:
    out = REPO / args.results
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for group, split, goal, flags in plan(args.groups):
        s = stem(split, flags, goal)
        if (out / f"{s}.log").exists():  # written when the run ends (the .json is rewritten every round)
            continue
        cmd = [sys.executable, str(REPO / "system" / "main.py"), "-data", split, "-m", "CNN", "-lr", "0.05",
               "-lbs", "10", "-ls", "1", "-go", goal, "--seed", "0", "--results_dir", str(out), "--no-progress",
               "-dev", "cpu", "--train_loss_eval", "off", *flags]
        start = time.time()
        print(f"[{group}] {s}: {' '.join(cmd[2:])}", flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        (out / f"{s}.log").write_text(done.stdout + done.stderr)
        print(f"    rc {done.returncode} in {time.time() - start:.0f} s", flush=True)


def cmd_report(args) -> None:
    """Markdown rows per run: DLG scores per attacked round, accuracy, epsilon, wall time."""
    import h5py

    out = REPO / args.results
    img = REPO / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    print("| group | split | algorithm | goal | round | PSNR dB (max) | SSIM | labels | final acc | DP eps max | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for group, split, goal, flags in plan(args.groups):
        s = stem(split, flags, goal)
        if not (out / f"{s}.h5").exists():
            continue
        with h5py.File(out / f"{s}.h5", "r") as f:
            h = {k: f[k][()] for k in f}
        meta = json.loads((out / f"{s}.json").read_text())
        algo = flags[flags.index("-algo") + 1]
        eps = f"{h['rs_dp_epsilon_max'][-1]:.2f}" if "rs_dp_epsilon_max" in h else "-"
        acc = f"{h['rs_test_acc'][-1]:.3f}"
        rounds = h.get("rs_dlg_round", [None])
        for i, r in enumerate(rounds):
            dl = ("-", "-", "-") if r is None else (f"{h['rs_dlg_psnr'][i]:.1f} ({h['rs_dlg_psnr_max'][i]:.1f})",
                                                    f"{h['rs_dlg_ssim'][i]:.3f}", f"{h['rs_dlg_label_acc'][i]:.2f}")
            print(f"| {group} | {split.split('_')[0]} | {algo} | {goal} | {'-' if r is None else int(r)} | "
                  f"{' | '.join(dl)} | {acc} | {eps} | {meta['wall_time_s']:.0f} |")
            if r is not None:
                shutil.copy(out / f"{s}_dlg_r{int(r)}.png", img / f"privacy_{split.split('_')[0]}_{algo}_{goal}_r{int(r)}.png")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "report"])
    p.add_argument("--groups", default="attack,update,dp", help="comma-separated: attack, update, dp")
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="folder of the source npz files")
    p.add_argument("--results", default="results/privacy", help="results folder (relative to the repo)")
    args = p.parse_args(argv)
    args.groups = args.groups.split(",")
    if args.command == "run":
        make_splits(Path(args.data))
        cmd_run(args)
    else:
        cmd_report(args)


if __name__ == "__main__":
    main()
