"""Result files -> runs grouped by configuration keys, with each column's mean ± std over the runs of a group:
what scripts/run/table.py renders as tables and system/get_mean_std.py prints as one line per algorithm and
dataset (and the docs' report scripts read through scripts/run/table.py).

``load_runs`` reads result files (``.h5`` with their ``.json`` sidecars; globs, folders), leaving out with a
warning the incomplete, untrained or malformed ones; ``aggregate`` groups them into ``Row``s with the
columns' statistics (``run_metrics``: best, last, selected, AUC, new-client, fairness, rounds to a target,
seconds and megabytes per round); ``check_rows`` warns where a mean hides a difference (seed counts, a seed
twice, keys that differ but are not grouped).
"""
from __future__ import annotations

import glob
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from utils.errors import FLError

# Config keys never compared between runs: the seed and the tag, paths, and where/how a run executed.
IGNORED = {"seed", "goal", "prev", "times", "results_dir", "dataset_root", "save_folder_name", "client_state_dir",
           "client_state", "resume", "checkpoint_every", "progress", "ray_address", "device_id", "workers",
           "max_restarts", "gpus_per_worker", "config", "tensorboard"}
HIGHER_IS_BETTER = {"best": True, "last": True, "selected": True, "auc": True, "new": True, "worst": True,
                    "p10": True, "spread": False, "target": False, "time": False, "comm": False}


class TableError(Exception):
    """Bad inputs (no files, an unknown group key): one line, exit code 2."""


@dataclass
class Run:
    path: Path
    meta: dict
    series: dict

    @property
    def config(self) -> dict:
        return self.meta.get("config", {})

    @property
    def complete(self) -> bool:
        """Every evaluation is there (the last one is round ``-gr``), or the sidecar says the run ended for
        good: finished (e.g. ``-ab``) or diverged. Files without a status: the round rule alone."""
        rounds = self.series.get("rs_round", [])
        gr = self.config.get("global_rounds")
        if self.meta.get("status") in ("finished", "diverged"):
            return True
        return len(rounds) > 0 and (gr is None or int(rounds[-1]) == gr)

    def key(self, name: str):
        if name == "algorithm":
            return self.meta.get("label", self.config.get("algorithm"))
        if name in self.config:
            value = self.config[name]
            return tuple(value) if isinstance(value, list) else value
        if name in self.meta and not isinstance(self.meta[name], (dict, list)):
            return self.meta[name]
        raise TableError(f"--group {name}: {self.path.name} has no config key '{name}'")


@dataclass
class Row:
    group: tuple
    runs: list[Run]
    stats: dict = field(default_factory=dict)  # column -> (mean, std, reached, n)


# ---- reading ---------------------------------------------------------------------------------------------
def find_files(inputs: list[str]) -> list[Path]:
    """Result ``.h5`` files named by paths, globs or folders (recursively), each once, in a stable order."""
    found: dict[Path, None] = {}
    for item in inputs:
        matches = [Path(m) for m in sorted(glob.glob(item, recursive=True))] or [Path(item)]
        for m in matches:
            if m.is_dir():
                for f in sorted(m.rglob("*.h5")):
                    found[f.resolve()] = None
            elif m.suffix in (".h5", ".json") and m.with_suffix(".h5").exists():
                found[m.with_suffix(".h5").resolve()] = None
            elif not m.exists():
                raise TableError(f"no result files match '{item}'")
            else:
                raise TableError(f"{m} is not a result file (.h5 or .json)")
    return list(found)


def read_run(path: Path) -> Run:
    """One result: its series and sidecar, each read through its schema (utils/results.py: regular files,
    numbers where numbers go); a file that is not one raises ``FLError``."""
    from utils.results import check_series, read_h5, read_sidecar

    series = check_series(read_h5(path), path)
    return Run(path, read_sidecar(path.with_suffix(".json")), series)


def load_runs(inputs: list[str], incomplete: bool = False, warn=None, untrained: bool = False) -> list[Run]:
    """Runs with a sidecar; incomplete ones (last evaluation before ``-gr``) only with ``incomplete``, untrained
    ones (``-gr 0``: the initial model evaluated) only with ``untrained``."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    runs = []
    for path in find_files(inputs):
        if not path.with_suffix(".json").exists():
            warn(f"{path.name} has no .json sidecar (configuration unknown); left out")
            continue
        try:
            run = read_run(path)
        except FLError as e:  # one malformed result is left out with one line; the others make the table
            warn(f"{path.name} left out: {' '.join(str(e).split())}")
            continue
        if not untrained and (run.meta.get("untrained") or run.config.get("global_rounds") == 0):
            warn(f"{path.name} was not trained (-gr 0: the initial model's evaluation); left out (--untrained "
                 f"includes it)")
            continue
        if run.meta.get("status") == "diverged":
            warn(f"{path.name} diverged ({run.meta.get('status_reason')}); its evaluations until then are counted")
        if not run.complete:
            rounds = run.series.get("rs_round", [])
            at = int(rounds[-1]) if len(rounds) else "none"
            status = f", status {run.meta['status']}" if run.meta.get("status") else ""
            if not incomplete:
                warn(f"{path.name} is incomplete (last evaluation: round {at} of {run.config.get('global_rounds')}"
                     f"{status}); left out (--incomplete includes it)")
                continue
        runs.append(run)
    if not runs:
        raise TableError(f"no complete result files with sidecars in {' '.join(inputs)}")
    return runs


# ---- metrics and grouping -----------------------------------------------------------------------------
def run_metrics(run: Run, target: float | None) -> dict:
    """One run's values: best/last accuracy and best AUC in %, first round reaching ``target`` (None when
    never), mean seconds per round. With ``--attack`` the accuracies, AUC and fairness columns are the benign
    clients' (``rs_benign_*``): the malicious clients are left out."""
    rs = "rs_benign_" if "rs_benign_test_acc" in run.series else "rs_"
    acc = np.asarray(run.series[f"{rs}test_acc"], dtype=float)
    out = {"best": 100 * float(np.nanmax(acc)), "last": 100 * float(acc[-1])}
    val = run.series.get("rs_val_acc")  # --val_ratio: the round chosen on validation data (the first best)
    out["selected"] = 100 * float(acc[int(np.nanargmax(val))]) if val is not None and len(val) else math.nan
    new = run.series.get("rs_new_test_acc")  # -nnc: the new clients' accuracy after fine-tuning
    out["new"] = 100 * float(new[-1]) if new is not None and len(new) else math.nan
    for col, key in (("worst", f"{rs}test_acc_min"), ("p10", f"{rs}test_acc_p10"), ("spread", f"{rs}test_acc_std")):
        values = run.series.get(key)  # at the last evaluation, as "last"
        out[col] = 100 * float(values[-1]) if values is not None and len(values) else math.nan
    auc = run.series.get(f"{rs}test_auc")
    out["auc"] = 100 * float(np.nanmax(auc)) if auc is not None and len(auc) else math.nan
    times = run.meta.get("round_time_s") or list(run.series.get("rs_round_time", []))
    out["time"] = float(np.mean(times)) if len(times) else math.nan
    up, down = run.series.get("rs_bytes_up"), run.series.get("rs_bytes_down")
    out["comm"] = float(np.mean(np.asarray(up) + np.asarray(down))) / 1e6 if up is not None and len(up) else math.nan
    if target is not None:
        rounds = np.asarray(run.series["rs_round"])
        hit = np.flatnonzero(acc >= target)
        out["target"] = float(rounds[hit[0]]) if len(hit) else None
    return out


def sort_key(group_keys: list[str], group: tuple, order: list[str]) -> tuple:
    parts = []
    for k, v in zip(group_keys, group):
        if k == "algorithm" and isinstance(v, str):
            base = v.split("+")[0]
            parts.append((order.index(base) if base in order else len(order), v))
        else:
            parts.append((0, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, str(v)))
    return tuple(parts)


def aggregate(runs: list[Run], group_keys: list[str], target: float | None = None,
              order: list[str] = ()) -> list[Row]:
    """Rows of runs with equal ``group_keys``, each column's mean and population std over the row's runs;
    rows sorted by the keys, algorithms in ``order`` (the registry's) first."""
    order = list(order)
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.key(k) for k in group_keys), []).append(run)
    rows = [Row(g, rs) for g, rs in sorted(groups.items(), key=lambda kv: sort_key(group_keys, kv[0], order))]
    for row in rows:
        per_run = [run_metrics(r, target) for r in row.runs]
        for col in [c for c in HIGHER_IS_BETTER if c != "target"] + (["target"] if target is not None else []):
            vals = [m[col] for m in per_run if m[col] is not None and not math.isnan(m[col])]
            mean = float(np.mean(vals)) if vals else math.nan
            std = float(np.std(vals)) if vals else math.nan
            row.stats[col] = (mean, std, len(vals), len(per_run))
    return rows


def _distinct(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def check_rows(rows: list[Row], group_keys: list[str], common: set[str] | None = None) -> list[str]:
    """Warnings: unequal seed counts, a seed twice in a row, runs differing in keys that are not grouped.
    Between rows that group by algorithm, only the keys in ``common`` (main.py's common flags) are compared
    when given."""
    warnings = []
    name = {id(r): " / ".join(map(str, r.group)) for r in rows}
    counts = {name[id(r)]: len(r.runs) for r in rows}
    if len(set(counts.values())) > 1:
        warnings.append("rows average different numbers of seeds: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for r in rows:
        seeds = [run.meta.get("seed") for run in r.runs]
        twice = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        if twice:
            warnings.append(f"{name[id(r)]}: seed(s) {', '.join(map(str, twice))} appear in more than one run "
                            f"(reruns under another -go?)")
    skip = IGNORED | set(group_keys) | ({"algorithm", "ala"} if "algorithm" in group_keys else set())
    # within a row: every key (the algorithm's own flags included)
    for r in rows:
        keys = sorted(set().union(*(run.config for run in r.runs)) - skip)
        for k in keys:
            vals = _distinct(run.config.get(k) for run in r.runs)
            if len(vals) > 1:
                warnings.append(f"{name[id(r)]} averages runs that differ in {k} ({', '.join(map(str, vals))}); "
                                f"add it to --group")
    # between rows: keys every run has (the common flags when the algorithm is grouped)
    if len(rows) > 1:
        every = set.intersection(*(set(run.config) for r in rows for run in r.runs)) - skip
        common = common if "algorithm" in group_keys else None
        keys = sorted(every & common if common else every)
        differing = []
        for k in keys:
            per_row = [_distinct(run.config.get(k) for run in r.runs) for r in rows]
            if len(_distinct(v for vals in per_row for v in vals)) > 1 and all(len(v) == 1 for v in per_row):
                by_value: dict = {}
                for r, v in zip(rows, per_row):
                    by_value.setdefault(json.dumps(v[0], default=str), []).append(name[id(r)])
                shown = "; ".join(f"{json.loads(v)}: {', '.join(rs) if len(rs) <= 3 else f'{len(rs)} rows'}"
                                  for v, rs in by_value.items())
                differing.append(f"{k} ({shown})")
        if differing:
            warnings.append("rows differ in keys that are not grouped: " + ", ".join(differing)
                            + "; add them to --group if intended")
    return warnings
