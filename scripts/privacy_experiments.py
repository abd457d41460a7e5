"""Experiment driver for docs/privacy.md: DLG / iDLG against FedAvg, FedALA and FedRep, with and without DP-SGD.

    python scripts/privacy_experiments.py run        # sequential, resumable (finished runs are skipped)
    python scripts/privacy_experiments.py report     # prints the table of every finished run
    python scripts/privacy_experiments.py sweep      # iDLG vs one DP-SGD release at several noise levels
    python scripts/privacy_experiments.py figures    # docs/img/privacy_*.png from the runs' grids

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
               "-dev", "cpu", "--train_loss_eval", "off", "--overwrite", *flags]  # an unfinished run starts over
        start = time.time()
        print(f"[{group}] {s}: {' '.join(cmd[2:])}", flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        (out / f"{s}.log").write_text(done.stdout + done.stderr)
        print(f"    rc {done.returncode} in {time.time() - start:.0f} s", flush=True)


def guess_floor(split: str, flags: list[str], round_idx: int) -> tuple[float, float]:
    """The grey-guess PSNR/SSIM of one attacked round, for result files written before the monitor
    recorded it: the same clients and batches (``attacked_positions`` / ``attacked_batch``; every client
    is active with -jr 1), scored by ``guess_scores``."""
    import torch

    sys.path.insert(0, str(REPO / "system"))
    from utils.data_utils import load_split
    from utils.dlg import denormalize
    from utils.privacy_monitor import attacked_batch, attacked_positions, guess_scores

    data = load_split(split)
    norm = data.config["normalize"]
    psnr, ssim = [], []
    for cid in attacked_positions(0, 0, round_idx, len(data.clients), 2):
        c = data.clients[cid]
        batch = attacked_batch(0, 0, round_idx, int(cid), 0, len(c.y_train), 1)
        x = c.x_train if "update" in flags else c.x_train[batch]
        p, q = guess_scores(denormalize(x, norm["mean"], norm["std"]), 1, norm["mean"], norm["std"])
        psnr.append(p)
        ssim.append(q)
    return float(torch.cat(psnr).mean()), float(torch.cat(ssim).mean())


def cmd_report(args) -> None:
    """Markdown rows per attacked round: scores, the grey-guess floor, accuracy, epsilon, wall time."""
    sys.path.insert(0, str(REPO / "system"))
    from utils.results import read_h5

    out = REPO / args.results
    print("| split | algorithm | attack / target | round | PSNR dB (max) | grey guess dB | SSIM (guess) | labels "
          "| final acc | DP eps max | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for group, split, goal, flags in plan(args.groups):
        s = stem(split, flags, goal)
        if not (out / f"{s}.log").exists():
            continue
        h = read_h5(out / f"{s}.h5")
        meta = json.loads((out / f"{s}.json").read_text())
        algo = flags[flags.index("-algo") + 1]
        eps = f"{h['rs_dp_epsilon_max'][-1]:.2f}" if "rs_dp_epsilon_max" in h else "-"
        for i, r in enumerate(h["rs_dlg_round"].astype(int)):
            if "rs_dlg_psnr_guess" in h:
                gp, gs = h["rs_dlg_psnr_guess"][i], h["rs_dlg_ssim_guess"][i]
            else:
                gp, gs = guess_floor(split, flags, r)
            print(f"| {split.split('_')[0]} | {algo} | {goal} | {r} | {h['rs_dlg_psnr'][i]:.1f} "
                  f"({h['rs_dlg_psnr_max'][i]:.1f}) | {gp:.1f} | {h['rs_dlg_ssim'][i]:.3f} ({gs:.3f}) | "
                  f"{h['rs_dlg_label_acc'][i]:.2f} | {h['rs_test_acc'][-1]:.3f} | {eps} | {meta['wall_time_s']:.0f} |")


def cmd_sweep(args) -> None:
    """iDLG against one DP-SGD release (batch 1, C = 1) of the initial MNIST model, over noise levels:
    the two images attacked in round 0 of the runs above, same seeds. The attacker is DP-aware (it clips
    its dummy gradient to C as well); sigma 0 = clipping alone."""
    import torch

    sys.path.insert(0, str(REPO / "system"))
    from flcore.trainmodel.models import build_model
    from utils import dlg
    from utils.data_utils import load_split
    from utils.dp_sgd import dp_gradient
    from utils.privacy_monitor import attacked_batch, attacked_positions
    from utils.seeding import torch_gen, torch_seeded

    torch.set_num_threads(1)
    split = next(iter(SPLITS))
    data = load_split(split)
    norm = data.config["normalize"]
    with torch_seeded(0, 0, "model"):
        model = build_model("CNN", data.input_shape, data.num_classes)
    print("| sigma | PSNR dB per image | SSIM per image | labels |")
    print("|---|---|---|---|")
    for sigma in args.sigmas:
        psnr, ssim, hits = [], [], 0
        for cid in attacked_positions(0, 0, 0, len(data.clients), 2):
            c = data.clients[cid]
            idx = attacked_batch(0, 0, 0, int(cid), 0, len(c.y_train), 1)
            x, y = c.x_train[idx], c.y_train[idx]
            target = (dlg.model_gradient(model, x, y) if sigma < 0 else
                      dp_gradient(model, x, y, 1.0, sigma, torch_gen(0, 0, "sweep-noise", int(cid))))
            rec = dlg.reconstruct(model, target, data.input_shape, 1, 10, method="idlg", iters=200,
                                  generator=torch_gen(0, 0, "dlg-init", 0, int(cid), 0),
                                  clip=None if sigma < 0 else 1.0)
            orig = dlg.denormalize(x, norm["mean"], norm["std"])
            got = dlg.denormalize(rec.x, norm["mean"], norm["std"])
            psnr.append(dlg.psnr(orig, got).item())
            ssim.append(dlg.ssim(orig, got).item())
            hits += int(rec.labels.item() == y.item())
        name = "none (no clipping)" if sigma < 0 else f"{sigma:g}"
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in psnr)} | {', '.join(f'{v:.3f}' for v in ssim)} | {hits}/2 |",
              flush=True)


FIGURES = {  # docs/img/<name>.png: (split, algorithm, goal, round, panel title)
    "privacy_mnist": [("MNIST_dir0.1_s6000", "FedAvg", "dlg-gradient", 2, "FedAvg, DLG, gradient"),
                      ("MNIST_dir0.1_s6000", "FedAvg", "idlg-gradient", 2, "FedAvg, iDLG, gradient"),
                      ("MNIST_dir0.1_s6000", "FedALA", "idlg-gradient", 2, "FedALA, iDLG, gradient"),
                      ("MNIST_dir0.1_s6000", "FedRep", "idlg-gradient", 2, "FedRep, iDLG, gradient"),
                      ("MNIST_dir0.1_s6000", "FedAvg", "idlg-update", 2, "FedAvg, iDLG, update"),
                      ("MNIST_dir0.1_s6000", "FedRep", "idlg-update", 2, "FedRep, iDLG, update"),
                      ("MNIST_dir0.1_s6000", "FedAvg", "idlg-gradient-dp0.1", 2, "DP σ=0.1, iDLG, gradient"),
                      ("MNIST_dir0.1_s6000", "FedAvg", "idlg-gradient-dp1.0", 2, "DP σ=1, iDLG, gradient")],
    "privacy_cifar10": [("Cifar10_dir0.1_s6000", "FedAvg", "idlg-gradient", 0, "FedAvg, iDLG, gradient, round 0"),
                        ("Cifar10_dir0.1_s6000", "FedAvg", "idlg-gradient", 2, "FedAvg, iDLG, gradient, round 2"),
                        ("Cifar10_dir0.1_s6000", "FedAvg", "idlg-update", 2, "FedAvg, iDLG, update, round 2")],
}


def cmd_figures(args) -> None:
    """Compose the per-run grids (originals above reconstructions) into the report's figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = REPO / args.results
    for name, panels in FIGURES.items():
        cols = min(4, len(panels))
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols, 2.6 * rows), squeeze=False)
        for ax in axes.ravel():
            ax.axis("off")
        for ax, (split, algo, goal, r, title) in zip(axes.ravel(), panels):
            ax.imshow(plt.imread(out / f"{split}_{algo}_{goal}_0_dlg_r{r}.png"))
            ax.set_title(title, fontsize=8)
        fig.tight_layout()
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        fig.savefig(REPO / "docs" / "img" / f"{name}.png", dpi=90)
        plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "report", "sweep", "figures"])
    p.add_argument("--sigmas", type=float, nargs="+", default=[-1, 0, 1e-3, 1e-2, 1e-1, 1.0],
                   help="sweep: noise multipliers (-1 = the plain gradient, no clipping)")
    p.add_argument("--groups", default="attack,update,dp", help="comma-separated: attack, update, dp")
    p.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="folder of the source npz files")
    p.add_argument("--results", default="results/privacy", help="results folder (relative to the repo)")
    args = p.parse_args(argv)
    args.groups = args.groups.split(",")
    if args.command == "run":
        make_splits(Path(args.data))
        cmd_run(args)
    elif args.command == "sweep":
        cmd_sweep(args)
    elif args.command == "figures":
        cmd_figures(args)
    else:
        cmd_report(args)


if __name__ == "__main__":
    main()
