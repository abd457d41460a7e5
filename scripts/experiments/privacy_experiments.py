"""Report functions for docs/privacy.md's MNIST / CIFAR-10 experiments: DLG / iDLG against FedAvg, FedALA and
FedRep, with and without DP-SGD. The runs are the sweep file ``scripts/experiments/privacy_repro.json``:

    python scripts/run/sweep.py --config scripts/experiments/privacy_repro.json      # the 13 runs, resumable
    python scripts/experiments/privacy_experiments.py report   # the table of every complete run
    python scripts/experiments/privacy_experiments.py sweep    # iDLG vs one DP-SGD release at several noise levels
    python scripts/experiments/privacy_experiments.py figures  # docs/img/privacy_*.png from the runs' grids

Scale (CPU): 20 clients, Dir(0.1), 6,000 images subsampled per dataset (seed 1), the 4-layer CNN, batch 10,
one local epoch, lr 0.05, seed 0. Attacks: rounds 0 and 2 of a 3-round run (-dlgg 2), 2 clients per
attacked round, one batch of one image each (-bnpc 1, --dlg_batch 1), 200 L-BFGS iterations (the sweep
file's grids: the textbook gradient, what each algorithm uploads, DP-SGD at two noise levels). The runs are
the sweep's own jobs (``sweep.build_jobs`` on the file), a run counts when ``sweep.is_complete`` says so,
and its series are read by ``utils.results.read_h5``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401
CONFIG = REPO / "scripts" / "experiments" / "privacy_repro.json"
SPLITS = ("MNIST_dir0.1_s6000", "Cifar10_dir0.1_s6000")


def goal(point: dict) -> str:
    """A run's short name from its grid point: attack, target and DP noise (``idlg-update``, ``idlg-gradient-dp0.1``)."""
    dp = f"-dp{point['-dps']}" if point.get("-dp") == "true" else ""
    return f"{point['--dlg_attack']}-{point.get('--dlg_target', 'gradient')}{dp}"


def runs(config: Path = CONFIG) -> list[tuple[str, str, str, object]]:
    """(split, algorithm, goal, sweep job) of every run of the sweep file, in its order."""
    from scripts.run import sweep

    spec = sweep.load_config_file(config)
    jobs, _ = sweep.build_jobs([str(a) for a in spec["base"]], spec["grids"], spec.get("seeds", [0]), spec["tag"],
                               REPO / spec["out"], spec.get("per_algorithm"))
    return [(j.grid_point["-data"], j.grid_point["-algo"], goal(j.grid_point), j) for j in jobs]


def cmd_report(args) -> None:
    """Markdown rows per attacked round: scores, the grey-guess floor, accuracy, epsilon, wall time."""
    from scripts.run import sweep
    from utils import fileio
    from utils.results import read_h5

    print("| split | algorithm | attack / target | round | PSNR dB (max) | grey guess dB | SSIM (guess) | labels "
          "| final acc | DP eps max | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for split, algo, name, job in runs(args.config):
        if not sweep.is_complete(job):
            continue
        h = read_h5(job.h5)
        meta = fileio.read_json(job.h5.with_suffix(".json"), "sidecar")
        eps = f"{h['rs_dp_epsilon_max'][-1]:.2f}" if "rs_dp_epsilon_max" in h else "-"
        for i, r in enumerate(h["rs_dlg_round"].astype(int)):
            gp, gs = h["rs_dlg_psnr_guess"][i], h["rs_dlg_ssim_guess"][i]
            print(f"| {split.split('_')[0]} | {algo} | {name} | {r} | {h['rs_dlg_psnr'][i]:.1f} "
                  f"({h['rs_dlg_psnr_max'][i]:.1f}) | {gp:.1f} | {h['rs_dlg_ssim'][i]:.3f} ({gs:.3f}) | "
                  f"{h['rs_dlg_label_acc'][i]:.2f} | {h['rs_test_acc'][-1]:.3f} | {eps} | {meta['wall_time_s']:.0f} |")


def cmd_sweep(args) -> None:
    """iDLG against one DP-SGD release (batch 1, C = 1) of the initial MNIST model, over noise levels:
    the two images attacked in round 0 of the runs above, same seeds. The attacker is DP-aware (it clips
    its dummy gradient to C as well); sigma 0 = clipping alone."""
    import torch

    from flcore.trainmodel.models import build_model
    from utils import dlg
    from utils.data_utils import load_split
    from utils.dp_sgd import dp_gradient
    from utils.privacy_monitor import attacked_batch, attacked_positions
    from utils.seeding import torch_gen, torch_seeded

    torch.set_num_threads(1)
    split = SPLITS[0]
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


FIGURES = {  # docs/img/<name>.png: (split, algorithm, run name (``goal``), round, panel title)
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
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from utils import fileio

    stems = {(split, algo, name): job for split, algo, name, job in runs(args.config)}
    for name, panels in FIGURES.items():
        cols = min(4, len(panels))
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols, 2.6 * rows), squeeze=False)
        for ax in axes.ravel():
            ax.axis("off")
        for ax, (split, algo, run_name, r, title) in zip(axes.ravel(), panels):
            job = stems[(split, algo, run_name)]
            png = fileio.read_bytes(job.out / f"{job.stem}_dlg_r{r}.png", "reconstruction", cap=fileio.JSON_CAP)
            ax.imshow(plt.imread(io.BytesIO(png), format="png"))
            ax.set_title(title, fontsize=8)
        fig.tight_layout()
        fileio.write_figure(REPO / "docs" / "img" / f"{name}.png", fig, dpi=90)
        plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["report", "sweep", "figures"])
    p.add_argument("--sigmas", type=float, nargs="+", default=[-1, 0, 1e-3, 1e-2, 1e-1, 1.0],
                   help="sweep: noise multipliers (-1 = the plain gradient, no clipping)")
    p.add_argument("--config", type=Path, default=CONFIG, help="the sweep file the runs came from")
    args = p.parse_args(argv)
    {"report": cmd_report, "sweep": cmd_sweep, "figures": cmd_figures}[args.command](args)


if __name__ == "__main__":
    main()
