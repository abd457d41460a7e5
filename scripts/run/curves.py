"""Every registered algorithm's short curve on a tiny Digits split, to check that a refactor changes no number.

    python scripts/run/curves.py --out results/curves_before.json            # record
    python scripts/run/curves.py --out results/curves_after.json --compare results/curves_before.json
    python scripts/run/curves.py --out results/curves_dp.json --flags="-dp" --no-ala     # the same, with DP-SGD
    python scripts/run/curves.py --out results/curves_dpc.json --flags="-dp --dp_level client -dps 0.5" --no-ala

Each algorithm runs ``-gr`` rounds (default 3) with the sequential executor, one thread and a fixed seed, once
plain and once with ``-ala`` (an algorithm that refuses ``-ala`` is recorded as refused; ``--no-ala``: plain
only). ``--flags`` adds the same main.py flags to every run (an algorithm that refuses them, as one that
refuses ``-dp``, is recorded as refused). The JSON file maps
``<algo>`` / ``<algo>+ALA`` to every per-round series of its result file (accuracy, loss, AUC, ...; wall times
left out) at full float precision. ``--compare`` exits 1 naming every curve that is not identical bit for bit.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

FLAGS = {"FedCP": ["-lam", "1"]}  # as tests/test_behaviour.py: Digits' small features need a smaller λ


def make_split(root: Path) -> None:
    from dataset import generate_Digits

    with contextlib.redirect_stdout(io.StringIO()):
        generate_Digits.main(["--root", str(root), "--num-clients", "5", "--partition", "dir", "--alpha", "1.0",
                              "--subsample", "500", "--seed", "1"])


def curve(root: Path, out: Path, algo: str, rounds: int, ala: bool, extra: list[str]) -> dict | str:
    import main
    from utils import fileio
    from utils.results import read_h5

    flags = ["-data", "Digits", "--dataset_root", str(root), "--results_dir", str(out), "-dev", "cpu",
             "--executor", "sequential", "--seed", "0", "--no-progress", "--no-print_config", "--overwrite",
             "-algo", algo, "-gr", str(rounds), "-lr", "0.1", *FLAGS.get(algo, []), *extra,
             *(["-ala"] if ala else [])]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = main.main(flags)
        except SystemExit as e:  # a flag the algorithm's parser refuses
            rc = e.code
    if rc != 0:
        return f"refused (exit {rc}): {err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ''}"
    (h5,) = out.glob(f"Digits_{algo}*_test_0.h5")
    series = read_h5(h5)
    fileio.Folder(out, create=False).remove(h5.name)  # the result this run wrote, by its name
    return {k: v.tolist() for k, v in sorted(series.items()) if "time" not in k}


def main(argv=None) -> int:
    import torch

    from flcore.registry import ALGORITHMS
    from utils import fileio

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--compare", default=None, help="a JSON file written before: report every curve that differs")
    p.add_argument("-gr", type=int, default=3)
    p.add_argument("--algos", default=None, help="comma-separated subset (default: every registered algorithm)")
    p.add_argument("--flags", default="", help='main.py flags added to every run, one string (--flags="-dp -dps 0.5")')
    p.add_argument("--no-ala", action="store_true", help="plain runs only (no +ALA curves)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    names = args.algos.split(",") if args.algos else list(ALGORITHMS)
    curves = {}
    tmp = fileio.make_private(tempfile.gettempdir(), "curves-", "temporary folder")  # removed below
    try:
        root, out = tmp / "data", tmp / "results"
        make_split(root)
        for algo in names:
            for ala in (False,) if args.no_ala else (False, True):
                key = algo + ("+ALA" if ala else "")
                curves[key] = curve(root, out, algo, args.gr, ala, shlex.split(args.flags))
                shown = curves[key] if isinstance(curves[key], str) else curves[key]["rs_test_acc"]
                print(f"{key}: {shown}", flush=True)
    finally:
        fileio.remove_made(tmp)
    fileio.write_file(args.out, json.dumps(curves, indent=1), "--out")
    if args.compare is None:
        return 0
    before = fileio.read_json(args.compare, "--compare")
    differ = [k for k in before if k in curves and json.dumps(before[k]) != json.dumps(curves[k])]  # NaN == NaN
    missing = [k for k in before if k not in curves]
    for k in differ:
        print(f"DIFFERS: {k}")
    print(f"{len(curves) - len(differ)} of {len(curves)} curves identical bit for bit"
          + (f"; not rerun: {', '.join(missing)}" if missing else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
