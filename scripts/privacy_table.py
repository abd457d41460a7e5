"""The Digits privacy table of docs/privacy.md: DLG and Inverting Gradients against FedAvg and FedALA, without
DP, with sample-level DP (DP-SGD) at two noise multipliers and with client-level DP (DP-FedAvg), with the
accuracy and epsilon of every run.

    python scripts/privacy_table.py run       # resumable: finished runs are skipped; the table is rewritten
                                              # (results/privacy_table/table.md) after every run
    python scripts/privacy_table.py report    # prints the table of the finished runs

Scale (CPU): scikit-learn's Digits (8x8), 20 clients by Dir(0.1) (split seed 1), every client in every round,
the 4-layer CNN, batch 10, one local epoch, lr 0.05, 10 rounds, seed 0. Attacks on the textbook gradient
(one batch of one image of the model a client starts the round from) in rounds 0 and 5, 2 clients per
attacked round: DLG (L-BFGS, 300 iterations) and IG (signed Adam, --ig_iters 1000, a quarter of the
reference code's 4000, to fit the CPU budget). Under sample-level DP the attacked gradient is the DP-SGD
release (clip 1, the attacker DP-aware); under client-level DP the server is the curator the mechanism trusts,
so it sees the raw gradient: client-level DP protects the released global models, not what the server sees.
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
SPLIT = "Digits_dir0.1_c20"
ALGOS = ("FedAvg", "FedALA")
ATTACKS = {"dlg": "DLG", "ig": "IG"}
SETTINGS = {  # name: (label in the table, flags)
    "nodp": ("none", []),
    "sample0.01": ("sample, σ = 0.01", ["-dp", "-dps", "0.01"]),
    "sample1": ("sample, σ = 1", ["-dp", "-dps", "1.0"]),
    "client1": ("client, z = 1, S = 1", ["-dp", "--dp_level", "client", "-dps", "1.0", "--dp_clip", "1.0"]),
}
COMMON = ["-data", SPLIT, "-m", "CNN", "-lr", "0.05", "-lbs", "10", "-ls", "1", "-gr", "10", "-eg", "5", "-jr", "1",
          "--seed", "0", "-dev", "cpu", "--no-progress", "--train_loss_eval", "off", "--overwrite",
          "-dlg", "-dlgg", "5", "--dlg_clients", "2", "-bnpc", "1", "--dlg_batch", "1", "--dlg_iters", "300",
          "--ig_iters", "1000"]


def plan() -> list[tuple[str, str, str, list[str]]]:
    """(algorithm, setting, attack, flags) of every run, in table order."""
    return [(algo, s, a, ["-algo", algo, *flags, "-dlga", a])
            for algo in ALGOS for s, (_, flags) in SETTINGS.items() for a in ATTACKS]


def stem(algo: str, setting: str, attack: str) -> str:
    return f"{SPLIT}_{algo}_{setting}-{attack}_0"


def make_split() -> None:
    if not (REPO / "dataset" / SPLIT / "config.json").exists():
        subprocess.run([sys.executable, str(REPO / "dataset" / "generate_Digits.py"), "--partition", "dir", "--alpha",
                        "0.1", "--num-clients", "20", "--seed", "1", "--out", SPLIT], check=True,
                       stdout=subprocess.DEVNULL)


def table(out: Path) -> str:
    sys.path.insert(0, str(REPO / "system"))
    from utils.results import read_h5

    # DP first: docs/privacy.md's per-algorithm table is read as the rows that start with an algorithm's name
    rows = ["| DP | algorithm | attack | PSNR dB, round 0 / 5 (max) | SSIM, round 0 / 5 | labels | grey guess dB | "
            "final acc | ε (δ = 1e-5) | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for algo, setting, attack, _ in plan():
        s = stem(algo, setting, attack)
        if not (out / f"{s}.log").exists() or not (out / f"{s}.h5").exists():
            continue
        h = read_h5(out / f"{s}.h5")
        meta = json.loads((out / f"{s}.json").read_text())
        psnr, ssim = h["rs_dlg_psnr"], h["rs_dlg_ssim"]
        eps = f"{h['rs_dp_epsilon_max'][-1]:.3g}" if "rs_dp_epsilon_max" in h else "—"
        rows.append(f"| {SETTINGS[setting][0]} | {algo} | {ATTACKS[attack]} | "
                    f"{' / '.join(f'{v:.1f}' for v in psnr)} ({max(h['rs_dlg_psnr_max']):.1f}) | "
                    f"{' / '.join(f'{v:.3f}' for v in ssim)} | {h['rs_dlg_label_acc'].mean():.2f} | "
                    f"{h['rs_dlg_psnr_guess'].mean():.1f} | {h['rs_test_acc'][-1]:.3f} | {eps} | "
                    f"{meta.get('wall_time_s', float('nan')):.0f} |")
    return "\n".join(rows) + "\n"


def cmd_run(args) -> None:
    out = REPO / args.results
    out.mkdir(parents=True, exist_ok=True)
    make_split()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for algo, setting, attack, flags in plan():
        s = stem(algo, setting, attack)
        if (out / f"{s}.log").exists():  # written when the run ends
            continue
        goal = f"{setting}-{attack}"
        cmd = [sys.executable, str(REPO / "system" / "main.py"), *COMMON, "-go", goal, "--results_dir", str(out),
               *flags]
        start = time.time()
        print(f"{s}: {' '.join(cmd[2:])}", flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        (out / f"{s}.log").write_text(done.stdout + done.stderr)
        print(f"    rc {done.returncode} in {time.time() - start:.0f} s", flush=True)
        (out / "table.md").write_text(table(out))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "report"])
    p.add_argument("--results", default="results/privacy_table", help="results folder (relative to the repo)")
    args = p.parse_args(argv)
    if args.command == "run":
        cmd_run(args)
    print(table(REPO / args.results), end="")


if __name__ == "__main__":
    main()
