"""The Digits privacy table of docs/privacy.md: DLG and Inverting Gradients against FedAvg and FedALA, without
DP, with sample-level DP (DP-SGD) at two noise multipliers and with client-level DP (DP-FedAvg), with the
accuracy and epsilon of every run. The runs are the sweep file ``scripts/experiments/privacy_table.json``:

    python dataset/generate_Digits.py --partition dir --alpha 0.1 --num-clients 20 --seed 1 --out Digits_dir0.1_c20
    python scripts/run/sweep.py --config scripts/experiments/privacy_table.json    # the 16 runs, resumable
    python scripts/experiments/privacy_table.py                                 # the table of the complete runs

Scale (CPU): scikit-learn's Digits (8x8), 20 clients by Dir(0.1) (split seed 1), every client in every round,
the 4-layer CNN, batch 10, one local epoch, lr 0.05, 10 rounds, seed 0. Attacks on the textbook gradient
(one batch of one image of the model a client starts the round from) in rounds 0 and 5, 2 clients per
attacked round: DLG (L-BFGS, 300 iterations) and IG (signed Adam, --ig_iters 1000, a quarter of the
reference code's 4000, to fit the CPU budget). Under sample-level DP the attacked gradient is the DP-SGD
release (clip 1, the attacker DP-aware); under client-level DP the server is the curator the mechanism trusts,
so it sees the raw gradient: client-level DP protects the released global models, not what the server sees.
The runs are the sweep's own jobs (``sweep.build_jobs`` on the file), a run counts when ``sweep.is_complete``
says so, and its series are read by ``utils.results.read_h5``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401
CONFIG = REPO / "scripts" / "experiments" / "privacy_table.json"
ALGOS = ("FedAvg", "FedALA")
ATTACKS = {"dlg": "DLG", "ig": "IG"}


def setting(point: dict) -> tuple[tuple, str]:
    """(sort key, the table's DP label) of a grid point: none, DP-SGD at sigma, or client-level DP at z, S."""
    if point.get("-dp") != "true":
        return (0, 0.0), "none"
    if point.get("--dp_level") == "client":
        return (2, float(point["-dps"])), f"client, z = {float(point['-dps']):g}, S = {float(point['--dp_clip']):g}"
    return (1, float(point["-dps"])), f"sample, σ = {float(point['-dps']):g}"


def table(config: Path = CONFIG) -> str:
    from scripts.run import sweep
    from utils import fileio
    from utils.results import read_h5

    spec = sweep.load_config_file(config)
    jobs, _ = sweep.build_jobs([str(a) for a in spec["base"]], spec["grids"], spec.get("seeds", [0]), spec["tag"],
                               REPO / spec["out"], spec.get("per_algorithm"))
    order = sorted(jobs, key=lambda j: (ALGOS.index(j.grid_point["-algo"]), setting(j.grid_point)[0],
                                        list(ATTACKS).index(j.grid_point["-dlga"])))
    # DP first: docs/privacy.md's per-algorithm table is read as the rows that start with an algorithm's name
    rows = ["| DP | algorithm | attack | PSNR dB, round 0 / 5 (max) | SSIM, round 0 / 5 | labels | grey guess dB | "
            "final acc | ε (δ = 1e-5) | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for job in order:
        if not sweep.is_complete(job):
            continue
        h = read_h5(job.h5)
        meta = fileio.read_json(job.h5.with_suffix(".json"), "sidecar")
        psnr, ssim = h["rs_dlg_psnr"], h["rs_dlg_ssim"]
        eps = f"{h['rs_dp_epsilon_max'][-1]:.3g}" if "rs_dp_epsilon_max" in h else "—"
        rows.append(f"| {setting(job.grid_point)[1]} | {job.grid_point['-algo']} | {ATTACKS[job.grid_point['-dlga']]} | "
                    f"{' / '.join(f'{v:.1f}' for v in psnr)} ({max(h['rs_dlg_psnr_max']):.1f}) | "
                    f"{' / '.join(f'{v:.3f}' for v in ssim)} | {h['rs_dlg_label_acc'].mean():.2f} | "
                    f"{h['rs_dlg_psnr_guess'].mean():.1f} | {h['rs_test_acc'][-1]:.3f} | {eps} | "
                    f"{meta.get('wall_time_s', float('nan')):.0f} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG, help="the sweep file the runs came from")
    args = p.parse_args(argv)
    print(table(args.config), end="")


if __name__ == "__main__":
    main()
