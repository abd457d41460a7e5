"""Result files -> a table of mean ± std over seeds, grouped by configuration keys.

    python scripts/run/table.py results/sweep                                   # every run in a sweep folder
    python scripts/run/table.py "results/*_bench-*.h5" --group algorithm,dataset --target 0.8 --format latex
    python scripts/run/table.py results/benchmark --columns best,last,time --commands

Inputs are result files (``.h5`` or their ``.json`` sidecars), globs or folders (searched recursively
for ``.h5``). Each run's configuration comes from its sidecar. Rows are groups of runs with equal values
of the ``--group`` keys (any config key; ``algorithm`` is the run's label, with "+ALA" for ``-ala`` runs
as in the result names); each cell is the mean ± std over the group's runs (population std, as
``system/get_mean_std.py``), one run per seed. Columns (``--columns``):

- ``best``: best test accuracy (%, sample-weighted over clients) over the evaluations, a round chosen on
  the test data; ``last``: at the last evaluation; ``selected``: at the evaluation of best validation
  accuracy (``--val_ratio``: the round chosen without the test data; the first of equal ones); ``auc``:
  best test AUC (%); ``new``: the new clients' accuracy after their fine-tuning (``-nnc``);
- ``worst``, ``p10``, ``spread`` (``--fairness``): the worst client's accuracy, the 10th percentile and
  the std of the clients' accuracies, at the last evaluation;
- ``target``: first evaluated round whose accuracy reaches ``--target`` (a fraction, or a percentage
  above 1); runs that never reach it are counted beside the mean ("(2/3)"), none reaching it shows "-";
- ``time``: seconds per round (the mean of the sidecar's per-round wall times; the mean over seeds);
- ``comm``: megabytes sent per round, up plus down, summed over clients (``rs_bytes_up``/``rs_bytes_down``;
  shown by default only when the runs recorded them);
- ``seeds``: how many runs the row averages.

With ``--attack`` every accuracy column (and AUC, worst, p10, spread) is over the benign clients only
(the ``rs_benign_*`` series; the malicious clients are in the sidecar's ``malicious_clients``).

The best entry of each column, as shown, is bold (markdown, LaTeX; the CSV names them in a ``best_in``
column): highest for accuracies and AUC, lowest for rounds, seconds and spread; a column where every row
ties has none. Warnings (stderr, one line each) when rows
average different numbers of seeds, when one seed appears twice in a row, when runs differ in config keys
that are not grouped (seed, goal, paths and run-only settings aside), for diverged runs (counted with
their evaluations until then) and for incomplete runs (interrupted, failed or still running: left out
unless ``--incomplete``). ``--commands`` adds, per row, the ``system/main.py`` command that
reproduces it (from the sidecar's configuration).
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from utils import summary  # noqa: E402
from utils.errors import FLError  # noqa: E402
# reading and grouping live in the library (system/get_mean_std.py shares them); the names stay here for
# the scripts that read runs through this one
from utils.summary import (HIGHER_IS_BETTER, IGNORED, Row, Run, TableError, find_files, load_runs,  # noqa: E402,F401
                           read_run, run_metrics, sort_key)

# Left out of reproduction commands: run-only settings and values the run resolves itself.
NOT_IN_COMMAND = (IGNORED - {"goal"}) | {"device", "executor", "num_classes"}
COLUMNS = {"best": "best acc (%)", "last": "last acc (%)", "selected": "acc at best val (%)", "auc": "best AUC (%)",
           "new": "new-client acc (%)", "worst": "worst client (%)", "p10": "10th pct client (%)",
           "spread": "std across clients (%)", "target": "rounds to {t}", "time": "s/round", "comm": "MB/round",
           "seeds": "seeds"}
FAIRNESS = ["worst", "p10", "spread"]
# Columns from series only some runs record: shown by default only when a run has them.
OPTIONAL_SERIES = {"selected": "rs_val_acc", "new": "rs_new_test_acc", "comm": "rs_bytes_up"}


def registry_order() -> list[str]:
    try:
        from flcore.registry import ALGORITHMS

        return list(ALGORITHMS)
    except ImportError:
        return []


def aggregate(runs: list[Run], group_keys: list[str], target: float | None = None) -> list[Row]:
    """``utils.summary.aggregate`` with the algorithms in the registry's order."""
    return summary.aggregate(runs, group_keys, target, order=registry_order())


def base_config_keys() -> set[str] | None:
    """The common flags of system/main.py (every algorithm has them), or None when it cannot be imported."""
    try:
        import cli

        return {a.dest for a in cli.base_parser().flags if a.option_strings}
    except Exception:  # noqa: BLE001 - only narrows the comparison below
        return None


def check_rows(rows: list[Row], group_keys: list[str]) -> list[str]:
    """``utils.summary.check_rows``, comparing rows of different algorithms on main.py's common flags only."""
    return summary.check_rows(rows, group_keys, common=base_config_keys())


# ---- rendering ----------------------------------------------------------------------------------------
def best_rows(rows: list[Row], col: str) -> set[int]:
    """The rows whose mean, as shown, is the column's best; none when every row shows it (a tie that
    singles nothing out)."""
    means = [round(r.stats[col][0], 1 if col == "target" else 2) for r in rows]
    ok = [m for m in means if not math.isnan(m)]
    if len(rows) < 2 or not ok:
        return set()
    best = max(ok) if HIGHER_IS_BETTER[col] else min(ok)
    marked = {i for i, m in enumerate(means) if m == best}
    return set() if len(marked) == len(rows) else marked


def cell(stats: tuple, col: str) -> str:
    mean, std, reached, n = stats
    if math.isnan(mean):
        return "-"
    if col in ("time", "comm"):
        return f"{mean:.2f}"
    digits = 1 if col == "target" else 2
    text = f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"
    return text + (f" ({reached}/{n})" if col == "target" and reached < n else "")


def headers(group_keys: list[str], columns: list[str], target: float | None) -> list[str]:
    tgt = "" if target is None else f"{100 * target:g}%"
    return [*group_keys, *(COLUMNS[c].format(t=tgt) for c in columns)]


def table_cells(rows: list[Row], columns: list[str]) -> tuple[list[list[str]], list[list[bool]]]:
    marks = {c: best_rows(rows, c) for c in columns if c in HIGHER_IS_BETTER}
    texts, bold = [], []
    for i, r in enumerate(rows):
        texts.append([str(v) for v in r.group] + [str(len(r.runs)) if c == "seeds" else cell(r.stats[c], c)
                                                   for c in columns])
        bold.append([False] * len(r.group) + [i in marks.get(c, ()) for c in columns])
    return texts, bold


MARKDOWN_SPECIAL = {"\\": "\\\\", "|": "\\|", "`": "\\`", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]",
                    "<": "&lt;", ">": "&gt;", "&": "&amp;", "#": "\\#"}


def one_line(text: str) -> str:
    """``text`` with every line break and control character made a space (a report line stays one line)."""
    return "".join(" " if ord(ch) < 32 or ord(ch) == 127 or ch in "\u2028\u2029\x85" else ch for ch in str(text))


def markdown_escape(text: str) -> str:
    """A string as Markdown text: no table cell break, code span, emphasis, link or HTML tag."""
    return "".join(MARKDOWN_SPECIAL.get(ch, ch) for ch in one_line(text))


def markdown_code(text: str) -> str:
    """A string as one Markdown code span, whatever backticks it holds."""
    text = one_line(text)
    ticks = "`" * (max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell: a string a spreadsheet would read as a formula (=, +, -, @, tab) gets a leading quote;
    numbers stay numbers."""
    if not isinstance(value, str):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value if value.startswith(FORMULA_START) else value


def render_markdown(head, texts, bold) -> str:
    lines = ["| " + " | ".join(markdown_escape(h) for h in head) + " |", "|" + "---|" * len(head)]
    for t, b in zip(texts, bold):
        lines.append("| " + " | ".join(f"**{markdown_escape(x)}**" if m else markdown_escape(x)
                                       for x, m in zip(t, b)) + " |")
    return "\n".join(lines)


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in one_line(text))


def render_latex(head, texts, bold, n_keys: int) -> str:
    def fmt(x: str, b: bool, is_key: bool) -> str:
        if is_key or not any(ch.isdigit() for ch in x) or x.isdigit():
            return latex_escape(x) if x != "-" else "--"
        body = latex_escape(x).replace(" ± ", r" \pm ")
        body = body.replace(r" (", r"\ (")
        return f"$\\mathbf{{{body}}}$" if b else f"${body}$"

    lines = [r"\begin{tabular}{" + "l" * n_keys + "r" * (len(head) - n_keys) + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in head) + r" \\", r"\midrule"]
    for t, b in zip(texts, bold):
        lines.append(" & ".join(fmt(x, m, j < n_keys) for j, (x, m) in enumerate(zip(t, b))) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def render_csv(rows: list[Row], group_keys: list[str], columns: list[str], commands: list[str] | None) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    stat_cols = [c for c in columns if c != "seeds"]
    head = [*group_keys, "seeds"]
    for c in stat_cols:
        head += [f"{c}_mean", f"{c}_std"] + (["target_reached"] if c == "target" else [])
    head.append("best_in")
    if commands is not None:
        head.append("command")
    w.writerow([csv_cell(h) for h in head])
    marks = {c: best_rows(rows, c) for c in stat_cols}
    for i, r in enumerate(rows):
        line = [*r.group, len(r.runs)]
        for c in stat_cols:
            mean, std, reached, _ = r.stats[c]
            line += ["" if math.isnan(mean) else f"{mean:.10g}", "" if math.isnan(std) else f"{std:.10g}"]
            line += [reached] if c == "target" else []
        line.append(";".join(c for c in stat_cols if i in marks[c]))
        if commands is not None:
            line.append(commands[i])
        w.writerow([csv_cell(one_line(v)) if isinstance(v, str) else v for v in line])
    return buf.getvalue().rstrip("\n")


# ---- reproduction commands ----------------------------------------------------------------------------
def run_index_flags(runs: list[int]) -> list[str]:
    lo, hi = min(runs), max(runs)
    if sorted(runs) != list(range(lo, hi + 1)):
        return ["-pv", str(lo), "-t", str(hi + 1)]  # a superset: the row's runs are among these
    return (["-pv", str(lo)] if lo else []) + (["-t", str(hi + 1)] if hi + 1 != 1 else [])


def reproduce_command(config: dict, runs: list[int]) -> str:
    """The ``system/main.py`` command that reruns these runs: every flag whose value differs from its
    default (the dataset, algorithm and rounds always), with the run indices as ``-pv``/``-t``."""
    import cli

    parser = cli.parser_for(config.get("algorithm"))
    always = ["dataset", "algorithm", "global_rounds"]
    actions = sorted(parser.flags, key=lambda a: always.index(a.dest) if a.dest in always else len(always))
    argv: list[str] = []
    for action in actions:
        dest = action.dest
        if not action.option_strings or dest in NOT_IN_COMMAND or dest not in config:
            continue
        value = config[dest]
        if value == action.default and dest not in always:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(f"--{'' if value else 'no-'}{flag.lstrip('-')}")
        elif action.nargs == 0 or (action.nargs == "?" and action.const is True):  # a store_true switch
            if bool(value) != bool(action.default):
                argv += [flag] if value else [flag, "false"]
        else:
            argv += [flag, str(value)]
    argv += run_index_flags(runs)
    return "python system/main.py " + " ".join(shlex.quote(a) for a in argv)


# ---- command line ---------------------------------------------------------------------------------------
def build_table(inputs: list[str], group_keys: list[str], columns: list[str], fmt: str = "md",
                target: float | None = None, commands: bool = False, incomplete: bool = False,
                untrained: bool = False, warn=None, drop_unrecorded: bool = False) -> str:
    """The table as text. ``drop_unrecorded``: leave out the ``selected``, ``new`` and ``comm`` columns when
    no run recorded their series (``OPTIONAL_SERIES``)."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    runs = load_runs(inputs, incomplete, warn, untrained)
    if drop_unrecorded:
        columns = [c for c in columns if c not in OPTIONAL_SERIES
                   or any(len(r.series.get(OPTIONAL_SERIES[c], [])) for r in runs)]
    rows = aggregate(runs, group_keys, target)
    for w in check_rows(rows, group_keys):
        warn(w)
    cmds = [reproduce_command(r.runs[0].config, [run.meta.get("run", 0) for run in r.runs]) for r in rows] \
        if commands else None
    if fmt == "csv":
        return render_csv(rows, group_keys, columns, cmds)
    head = headers(group_keys, columns, target)
    texts, bold = table_cells(rows, columns)
    names = [" / ".join(map(str, r.group)) for r in rows]
    if fmt == "latex":
        out = render_latex(head, texts, bold, len(group_keys))
        # a comment line each: nothing in a name or a command may end it (a line break would start live LaTeX)
        return out + ("".join(f"\n% {one_line(n)}: {one_line(c)}" for n, c in zip(names, cmds)) if cmds else "")
    out = render_markdown(head, texts, bold)
    return out + ("\n\nReproduce a row:\n\n" + "\n".join(f"- {markdown_escape(n)}: {markdown_code(c)}"
                                                         for n, c in zip(names, cmds)) if cmds else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="result files (.h5/.json), globs, or folders")
    p.add_argument("--group", default="algorithm", help="config keys that make a row (comma-separated)")
    p.add_argument("--columns", default=None,
                   help=f"comma-separated, of {','.join(COLUMNS)} (default: best,last,selected,auc,new,target,"
                        "time,comm,seeds; selected, new and comm where a run recorded them, target with --target)")
    p.add_argument("--fairness", action="store_true",
                   help="add the worst client's accuracy, the 10th percentile and the std across clients (at the "
                        "last evaluation)")
    p.add_argument("--target", type=float, default=None, help="accuracy for 'rounds to target' (0.8 or 80)")
    p.add_argument("--format", default="md", choices=["md", "latex", "csv"])
    p.add_argument("--commands", action="store_true", help="add the command that reproduces each row")
    p.add_argument("--incomplete", action="store_true", help="include runs that stopped before -gr")
    p.add_argument("--untrained", action="store_true", help="include -gr 0 runs (the initial model evaluated)")
    p.add_argument("-o", "--output", type=Path, default=None, help="write the table here instead of stdout")
    args = p.parse_args(argv)
    target = None if args.target is None else args.target / 100 if args.target > 1 else args.target
    default_cols = (["best", "last", "selected", "auc", "new"] + (["target"] if target is not None else [])
                    + ["time", "comm", "seeds"])
    columns = default_cols if args.columns is None else [c.strip() for c in args.columns.split(",") if c.strip()]
    if args.fairness:
        columns = [*columns[:-1], *FAIRNESS, columns[-1]] if columns[-1] == "seeds" else [*columns, *FAIRNESS]
    group_keys = [k.strip() for k in args.group.split(",") if k.strip()]
    try:
        bad = [c for c in columns if c not in COLUMNS]
        if bad:
            raise TableError(f"--columns: unknown {bad[0]} (choose from {', '.join(COLUMNS)})")
        if "target" in columns and target is None:
            raise TableError("--columns target needs --target")
        if not group_keys:
            raise TableError("--group needs at least one key")
        text = build_table(args.inputs, group_keys, columns, args.format, target, args.commands, args.incomplete,
                           args.untrained, drop_unrecorded=args.columns is None)
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output:
        from utils import fileio

        try:  # through a temporary file renamed into place (a symlink at the name is replaced, not followed)
            fileio.write_bytes(fileio.Folder(args.output.parent or Path("."), what="-o"), args.output.name,
                               (text + "\n").encode())
        except FLError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
