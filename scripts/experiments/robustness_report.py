"""docs/robustness.md's table from the robustness sweep, through a compact export of every run.

    python scripts/run/sweep.py --config scripts/experiments/robustness.json -j 1  # resumable; --seeds 0 first
    python scripts/experiments/robustness_report.py                                # export + table -> doc
    python scripts/experiments/robustness_report.py --from-export --print          # the table from the export alone

The export (``docs/benchmarks/robustness.json``) holds per run its algorithm, attack, aggregator and seed,
the benign clients' and all clients' accuracy per evaluation, the malicious clients and the CPU seconds the
sweep recorded; runs found in ``--results`` replace the same (algorithm, attack, aggregator, seed) and every
other entry is kept, so the table grows over several sweeps. A cell is the mean ± std (population std)
over the seeds of the benign clients' accuracy at the last round (every client's without an attack), in %;
a cell of one seed is its value alone (no spread), a cell with fewer finished seeds than the others says
how many, a run that diverged (its training loss became NaN or inf) is counted in its cell ("2 diverged", or
"diverged" when every seed did), and a cell not run is "-". The table replaces the block between
``<!-- robustness:begin -->`` and ``<!-- robustness:end -->``.

``--converged``: the converged table (``scripts/experiments/robustness_converged.json``, docs/robustness.md's
"Converged table") from ``results/robustness_converged`` into ``docs/benchmarks/robustness_converged.json``. Its
cells are the sweep file's grid points; a cell is a number only once all of its seeds (3) have ended, and
"pending (k/3)" until then; ``--close`` (kept in the export) says the sweep has stopped at its budget, and the
cells it left incomplete read "cut (k/3)". Every run's benign accuracy is taken over one fixed set of clients per
seed, the ones not in that seed's malicious set (plugins/attacks.py ``malicious_clients`` at the sweep's share),
sample-weighted by the split's test counts, for unattacked runs and Local too; for attacked runs it equals the
recorded ``rs_benign_test_acc`` (checked). Backdoor cells add the attack success rate; it is NaN (null in the
export) for every other run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from scripts.experiments.benchmark_report import write_block  # noqa: E402

from plugins.attack import DEFAULT_FRACTION  # noqa: E402
from plugins.attacks import malicious_clients  # noqa: E402
from utils import fileio  # noqa: E402
from utils.errors import FLError  # noqa: E402
from utils.results import read_h5, read_sidecar  # noqa: E402

EXPORT = REPO / "docs" / "benchmarks" / "robustness.json"
ATTACKS = ("none", "signflip", "gaussian", "labelflip", "scaled")
ALGOS = ("FedAvg", "FedAvgM", "FedALA", "Ditto", "FedRep")
RULES = ("mean", "median", "trimmed_mean", "krum", "multikrum", "geomed")  # the quick table's columns
CONVERGED = {"sweep": REPO / "scripts" / "experiments" / "robustness_converged.json",
             "results": REPO / "results" / "robustness_converged",
             "export": REPO / "docs" / "benchmarks" / "robustness_converged.json", "block": "robustness-converged"}
CONV_COLUMNS = ("mean", "median", "trimmed_mean", "krum", "multikrum", "geomed", "bulyan", "cclip", "normclip")


def key(entry: dict) -> tuple:
    return entry["algorithm"], entry["attack"], entry["aggregator"], entry["seed"]


def readable(folder: Path, read) -> list[dict]:
    """``read(sidecar)`` of every sidecar of the sweep folder that is not None; a run whose files fail their
    schema (``utils.results``: a sidecar not a JSON object, an h5 without its series, a field missing or of
    another type) is left out with one warning line."""
    out = []
    for side in sorted(folder.glob("*.json")):
        try:
            entry = read(side)
        except (FLError, KeyError, TypeError, ValueError, IndexError) as e:
            why = fileio.why(e) if isinstance(e, FLError) else f"{type(e).__name__}: {fileio.why(e)}"
            print(f"warning: {side.name} left out ({why})", file=sys.stderr)
            continue
        if entry is not None:
            out.append(entry)
    return out


def cpu_seconds(folder: Path, stem: str):
    """The CPU seconds the sweep recorded for a run (``logs/<stem>.cpu.json``), None where it recorded none."""
    cpu = folder / "logs" / f"{stem}.cpu.json"
    return fileio.read_json(cpu, "CPU record")["cpu_s"] if cpu.exists() else None


def read_results(folder: Path) -> list[dict]:
    """Every finished or diverged run of the sweep folder as an export entry (``status``)."""
    def entry(side: Path) -> dict | None:
        meta = read_sidecar(side)
        if meta.get("status") not in ("finished", "diverged"):
            return None
        cfg = meta["config"]
        series = read_h5(side.with_suffix(".h5"))
        benign = series.get("rs_benign_test_acc", series["rs_test_acc"])
        return {"algorithm": meta["label"], "attack": cfg.get("attack") or "none", "aggregator": cfg["aggregator"],
                "seed": meta["seed"], "status": meta["status"], "benign_acc": [round(float(a), 6) for a in benign],
                "all_acc": [round(float(a), 6) for a in series["rs_test_acc"]],
                "malicious_clients": meta.get("malicious_clients", []), "cpu_s": cpu_seconds(folder, side.stem)}
    return readable(folder, entry)


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    entries = {key(e): e for e in old} | {key(e): e for e in new}
    return [entries[k] for k in sorted(entries, key=lambda k: (k[0], k[1], k[2], k[3]))]


def markdown(entries: list[dict]) -> str:
    """One row per (algorithm, attack), one column per aggregator (see the module docstring)."""
    cells: dict[tuple, list[float]] = {}
    diverged: dict[tuple, int] = {}
    for e in entries:
        cell = (e["algorithm"], e["attack"], e["aggregator"])
        if e.get("status", "finished") == "diverged":
            diverged[cell] = diverged.get(cell, 0) + 1
        else:
            cells.setdefault(cell, []).append(100 * e["benign_acc"][-1])
    most = max((len(v) + diverged.get(c, 0) for c, v in cells.items()), default=0)
    lines = ["| algorithm | attack | " + " | ".join(RULES) + " |", "|---|---|" + "---|" * len(RULES)]
    for algo in ALGOS:
        for attack in ATTACKS:
            row = []
            for rule in RULES:
                v, lost = cells.get((algo, attack, rule), []), diverged.get((algo, attack, rule), 0)
                if not v:
                    row.append("diverged" if lost else "-")
                    continue
                text = f"{v[0]:.1f}" if len(v) == 1 else f"{np.mean(v):.1f} ± {np.std(v):.1f}"
                notes = [f"{len(v)}"] if len(v) + lost < most else []
                notes += [f"{lost} diverged"] if lost else []
                row.append(text + (f" ({', '.join(notes)})" if notes else ""))
            if any(c != "-" for c in row):
                lines.append(f"| {algo} | {attack} | " + " | ".join(row) + " |")
    cpu = sum(e["cpu_s"] or 0.0 for e in entries)
    seeds = sorted({e["seed"] for e in entries})
    lines.append("")
    lost = sum(diverged.values())
    lines.append(f"{len(entries)} runs (seeds {', '.join(map(str, seeds))}; {lost} diverged), {cpu / 3600:.2f} "
                 f"CPU-hours as the sweep recorded them.")
    return "\n".join(lines)


# ---- the converged table ------------------------------------------------------------------------------------
def cell_key(algorithm: str, attack: str | None, scale, aggregator: str | None, krum_f) -> tuple:
    """(algorithm, row label, column label) of a run or a grid point."""
    row = attack or "none"
    if scale is not None:
        row += f" ({'ε' if attack == 'ipm' else 's'} = {float(scale):g})"
    col = "-" if algorithm == "Local" else (aggregator or "mean") + ("" if krum_f is None else f" f={krum_f}")
    return algorithm, row, col


def planned_cells(sweep: Path) -> list[tuple]:
    """The sweep file's grid points as cells, in its order."""
    spec = fileio.read_json(sweep, "sweep file")
    cells = []
    for grid in spec["grids"]:
        keys = list(grid)
        for combo in itertools.product(*(grid[k] for k in keys)):
            p = dict(zip(keys, combo))
            cell = cell_key(p["-algo"], p.get("--attack"), p.get("--attack_scale"), p.get("--aggregator"),
                            p.get("--krum_f"))
            if cell not in cells:
                cells.append(cell)
    return cells


def benign_curve(acc: np.ndarray, test_samples: list[int], bad: list[int]) -> np.ndarray:
    """Per evaluation, the accuracy over the clients not in ``bad``, weighted by their test counts."""
    n = np.array(test_samples, dtype=np.float64)
    ok = np.array([i not in set(bad) for i in range(len(n))])
    return (acc[:, ok] * n[ok]).sum(1) / n[ok].sum()


def read_converged(folder: Path, test_samples: list[int]) -> list[dict]:
    """Every ended run of the converged sweep folder as an export entry (see the module docstring)."""
    def entry(side: Path) -> dict | None:
        meta = read_sidecar(side)
        if meta.get("status") not in ("finished", "diverged"):
            return None
        cfg, series = meta["config"], read_h5(side.with_suffix(".h5"))
        bad = malicious_clients(cfg["seed"], meta["run"], len(test_samples), cfg.get("attack_frac") or DEFAULT_FRACTION)
        curve = benign_curve(np.asarray(series["rs_client_test_acc"], dtype=np.float64), test_samples, bad)
        if "rs_benign_test_acc" in series and not np.allclose(curve, series["rs_benign_test_acc"], equal_nan=True):
            raise SystemExit(f"error: {side.name}: its benign clients are not the seed's malicious set's complement")
        asr = series.get("rs_backdoor_asr")
        return {"algorithm": meta["label"], "attack": cfg.get("attack") or "none", "scale": cfg.get("attack_scale"),
                "aggregator": cfg["aggregator"], "krum_f": cfg.get("krum_f"), "seed": meta["run"],
                "status": meta["status"], "benign_acc": [round(float(a), 6) for a in curve],
                "asr": None if asr is None or not np.isfinite(asr[-1]) else round(float(asr[-1]), 6),
                "goal": cfg["goal"], "cpu_s": cpu_seconds(folder, side.stem)}
    return readable(folder, entry)


def conv_key(e: dict) -> tuple:
    return cell_key(e["algorithm"], None if e["attack"] == "none" else e["attack"], e["scale"], e["aggregator"],
                    e["krum_f"]) + (e["seed"],)


def spread(values: list[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def converged_markdown(entries: list[dict], cells: list[tuple], seeds: int, cpu_all: float | None,
                       closed: bool = False) -> str:
    """One row per (algorithm, attack), one column per aggregator; a cell is a number once all ``seeds``
    runs have ended, "pending (k/seeds)" before (a cell of the cut rule), blank when not in it. ``closed``:
    the sweep has stopped at its budget, so an incomplete cell is "cut (k/seeds)", never to be a number."""
    ended: dict[tuple, list[dict]] = {}
    for e in entries:
        ended.setdefault(conv_key(e)[:3], []).append(e)
    cols = [c for c in CONV_COLUMNS if any(k[2] == c for k in cells)]
    cols += [c for c in dict.fromkeys(k[2] for k in cells) if c not in cols and c != "-"]
    algos = list(dict.fromkeys(k[0] for k in cells))
    attacks = list(dict.fromkeys(["none", *(k[1] for k in cells)]))
    rows = sorted(dict.fromkeys(k[:2] for k in cells), key=lambda r: (algos.index(r[0]), attacks.index(r[1])))
    lines = ["| algorithm | attack | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    complete = 0
    for algo, row in rows:
        out = []
        for col in cols:
            key = (algo, row, "-" if algo == "Local" and col == "mean" else col)
            if key not in cells:
                out.append("")
                continue
            runs = ended.get(key, [])
            if len(runs) < seeds:
                out.append(f"{'cut' if closed else 'pending'} ({len(runs)}/{seeds})")
                continue
            complete += 1
            ok = [r for r in runs if r["status"] == "finished"]
            lost = len(runs) - len(ok)
            if not ok:
                out.append("diverged")
                continue
            text = spread([100 * r["benign_acc"][-1] for r in ok])
            if row.startswith("backdoor"):
                text += " / ASR " + spread([100 * r["asr"] for r in ok if r["asr"] is not None])
            out.append(text + (f" ({lost} diverged)" if lost else ""))
        lines.append(f"| {algo} | {row} | " + " | ".join(out) + " |")
    cpu = sum(e["cpu_s"] or 0.0 for e in entries)
    spent = "" if cpu_all is None else (f"; {cpu_all / 3600:.2f} CPU-hours spent by the sweep"
                                        f"{'' if closed else ' so far'}, unfinished runs included")
    lines += ["", f"{complete} of {len(cells)} cells complete ({len(entries)} ended runs, {cpu / 3600:.2f} CPU-hours "
              f"as the sweep recorded them{spent})."]
    if closed:
        lines.append(f"The sweep stopped at the issue's budget: {len(cells) - complete} cells of the cut rule are cut "
                     f"(the runs of a cell cut part-way are in the export, never in a number).")
    if any(r.startswith("backdoor") for _, r in rows):
        lines.append("Backdoor cells: benign accuracy / attack success rate (%). Local: no aggregation.")
    return "\n".join(lines)


def counted_file(folder: Path, export: Path) -> Path:
    """Where the sweep's folder records the CPU seconds of each run that the total of ``export`` holds: one
    file per export (``logs/exported_cpu.<export's stem>.json``), so an export written elsewhere (a preview)
    leaves the others' counts as they were."""
    return folder / "logs" / f"exported_cpu.{export.stem}.json"


def cpu_total(folder: Path, export: Path, earlier: float | None) -> tuple[float | None, dict[str, float]]:
    """The sweep's CPU seconds over every attempt: the ``earlier`` total of ``export`` plus what the folder's
    CPU records (``logs/<stem>.cpu.json``, which grow with each attempt) gained since that export last took
    them in (``counted_file``). A fresh folder (a clone, another machine) so adds to the total, and an export
    repeated on the same folder adds nothing twice. Returns the total (None where no attempt was recorded at
    all) and the figures it took in, which ``mark_counted`` records once the export holding the total is
    written."""
    logs, marker = folder / "logs", counted_file(folder, export)
    now = {stem: float(cpu_seconds(folder, stem))
           for stem in sorted(p.name.removesuffix(".cpu.json") for p in logs.glob("*.cpu.json"))}
    if not now:
        return earlier, now
    counted = fileio.read_json(marker, "CPU already counted") if marker.exists() else {}
    if not isinstance(counted, dict) or not all(type(v) in (int, float) for v in counted.values()):
        raise FLError(f"{marker}: not a JSON object of CPU seconds per run")
    # a record smaller than its counted figure was started over (its log removed): all of it is new
    gained = sum(cpu - counted.get(stem, 0.0) if cpu >= counted.get(stem, 0.0) else cpu for stem, cpu in now.items())
    return (earlier or 0.0) + gained, now


def mark_counted(folder: Path, export: Path, now: dict[str, float]) -> None:
    """Record the CPU figures the total of ``export`` took in (``cpu_total``): written after the export, so an
    export that failed to write leaves them to be counted by the next one."""
    if now:
        fileio.write_file(counted_file(folder, export), json.dumps(now, indent=0) + "\n", "CPU already counted")


def report_converged(args) -> int:
    old = fileio.read_json(args.export, "--export") if args.export.exists() else {}
    closed = args.close or old.get("closed") is True  # once closed, every later export stays so
    if args.from_export:
        data = old
    else:
        spec = fileio.read_json(CONVERGED["sweep"], "sweep file")
        split = spec["base"][spec["base"].index("-data") + 1]
        cfg_path = args.dataset_root / split / "config.json"
        if not cfg_path.exists():
            raise SystemExit(f"error: {cfg_path} not found: generate the split (docs/robustness.md) or use --from-export")
        test_samples = fileio.read_json(cfg_path, "config.json")["test_samples"]
        new = read_converged(args.results, test_samples)
        runs = {conv_key(e): e for e in old.get("runs", [])} | {conv_key(e): e for e in new}
        cpu_all, counted = cpu_total(args.results, args.export, old.get("cpu_s_all_attempts"))
        data = {"split": split, "test_samples": test_samples, "cpu_s_all_attempts": cpu_all,
                "closed": closed,
                "runs": [runs[k] for k in sorted(runs, key=str)]}
        body = ",\n".join(json.dumps(e) for e in data["runs"])
        head = json.dumps({k: v for k, v in data.items() if k != "runs"})[:-1]
        fileio.write_file(args.export, head + ', "runs": [\n' + body + "\n]}\n", "--export")  # a run a line
        mark_counted(args.results, args.export, counted)
    seeds = len(fileio.read_json(CONVERGED["sweep"], "sweep file")["seeds"])
    text = converged_markdown(data.get("runs", []), planned_cells(CONVERGED["sweep"]), seeds,
                              data.get("cpu_s_all_attempts"), closed=closed)
    if args.print:
        print(text)
    else:
        write_block(args.doc, CONVERGED["block"], text)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "results" / "robustness", help="the sweep's folder")
    p.add_argument("--export", type=Path, default=EXPORT)
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "robustness.md")
    p.add_argument("--from-export", action="store_true", help="the table from the export alone")
    p.add_argument("--print", action="store_true", help="print the table instead of writing the document")
    p.add_argument("--converged", action="store_true", help="the converged table (module docstring)")
    p.add_argument("--close", action="store_true",
                   help="--converged: the sweep stopped at its budget: incomplete cells are cut (kept in the export)")
    p.add_argument("--dataset_root", type=Path, default=REPO / "dataset", help="--converged: where the split is")
    args = p.parse_args(argv)
    try:
        return report(args, argv)
    except FLError as e:  # an export, sweep file or split config that cannot be read: one line
        print(f"error: {e}", file=sys.stderr)
        return 2


def report(args, argv) -> int:
    """The table (or the converged one) as the flags ask."""
    if args.converged:
        given = set(argv if argv is not None else sys.argv[1:])
        args.results = args.results if "--results" in given else CONVERGED["results"]
        args.export = args.export if "--export" in given else CONVERGED["export"]
        return report_converged(args)
    old = fileio.read_json(args.export, "--export")["runs"] if args.export.exists() else []
    entries = old if args.from_export else merge(old, read_results(args.results))
    if not args.from_export:  # a run a line
        fileio.write_file(args.export, '{"runs": [\n' + ",\n".join(json.dumps(e) for e in entries) + "\n]}\n",
                          "--export")
    text = markdown(entries)
    if args.print:
        print(text)
    else:
        write_block(args.doc, "robustness", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
