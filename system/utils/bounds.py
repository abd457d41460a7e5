"""Every numeric flag's accepted range, in one table, enforced in one place (``check``, called by
cli.parse_config once the flags are parsed) and written out in docs/security.md ("Numeric flags",
``markdown``; a test keeps the two equal). No other module checks a numeric flag's range: cli.validate and
the plug-ins keep only checks between flags (``-pv < -t``, a flag that needs another).

A flag listed in ``RANGES`` takes values in its ``Range`` (bounds inclusive unless marked open; ``zero``: 0
as well). Every other integer flag (an algorithm's own among them) takes values up to ``INT_MAX`` in
magnitude, and every other float flag 0 or a magnitude in [``TINY``, ``HUGE``]: what float32 training can
take (a weight of 1e300 overflows float32, whose largest value is 3.4e38, and 1e-300 underflows to 0 or to a
denormal that makes a division blow up). No float flag takes a magnitude in (0, ``TINY``) or a value that is
not finite, whatever its range.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from utils.errors import FLError

INT_MAX = 10 ** 9
TINY, HUGE = 1e-30, 1e6



class Range(NamedTuple):
    """[lo, hi] (``lo_open`` / ``hi_open``: that end excluded), and 0 too where ``zero``."""
    lo: float
    hi: float
    why: str = ""
    lo_open: bool = False
    hi_open: bool = False
    zero: bool = False


# dest -> Range (lowest, highest, why the bound): both inclusive unless marked open.
RANGES: dict[str, Range] = {
    "seed": (0, 2 ** 31 - 1, "run i seeds torch and numpy with seed + i"),
    "global_rounds": (0, 10 ** 6, ""),
    "local_epochs": (1, 10 ** 4, ""),
    "batch_size": (1, 10 ** 8, ""),
    "eval_batch_size": (1, 10 ** 8, ""),
    "times": (1, 10 ** 4, ""),
    "prev": (0, 10 ** 4, ""),
    "workers": (0, 1024, "one process each"),
    "num_clients": (1, 10 ** 6, ""),
    "num_new_clients": (0, 10 ** 6, ""),
    "num_classes": (1, 10 ** 6, "the classifier has one output each"),
    "vocab_size": (2, 10 ** 7, "the embedding has one row each"),
    "feature_dim": (1, 10 ** 5, "a layer of this width"),
    "local_learning_rate": (TINY, 1e30, "float32 holds it; a rate that large diverges, which a run reports"),
    "learning_rate_decay_gamma": (TINY, 1.0, "the rate is lr * gamma^round"),
    "time_threshold": (TINY, 1e9, "seconds"),
    "dp_clip": (1e-12, 1e12, "a per-sample gradient norm bound; one above every gradient's norm clips nothing"),
    "dp_delta": (TINY, 0.5, ""),
    "server_tau": (1e-12, 1e3, "added to a square root in the denominator"),
    "server_learning_rate": (TINY, HUGE, ""),
    "top_cnt": (0, 10 ** 6, ""),
    "eval_gap": (1, 10 ** 6, ""),
    "checkpoint_every": (0, 10 ** 6, ""),
    "max_restarts": (0, 10 ** 4, ""),
    "few_shot": (0, 10 ** 6, ""),
    "fine_tuning_epoch_new": (0, 10 ** 4, ""),
    "ala_window": (2, 10 ** 4, ""),
    "ala_max_epochs": (1, 10 ** 5, ""),
    "dlg_iters": (1, 10 ** 6, ""),
    "ig_iters": (1, 10 ** 6, ""),
    "dlg_clients": (1, 10 ** 6, ""),
    "dlg_batch": (1, 10 ** 5, ""),
    "krum_f": (0, 10 ** 6, ""),
    "attack_scale": (TINY, HUGE, ""),
    # cli.py's common flags
    "join_ratio": (TINY, 1.0, "a share of the clients"),
    "client_drop_rate": Range(0.0, 1.0, "a probability", hi_open=True),
    "train_slow_rate": (0.0, 1.0, "a share of the clients"),
    "send_slow_rate": (0.0, 1.0, "a share of the clients"),
    "train_loss_fraction": (TINY, 1.0, "a share of the clients"),
    "val_ratio": Range(0.0, 1.0, "a share of each client's training data", hi_open=True),
    "batch_clients": (0, INT_MAX, ""),
    "gpus_per_worker": Range(1e-4, HUGE, "Ray's least share of a GPU is 0.0001", zero=True),
    # the plug-ins' flags (system/plugins/)
    "dlg_gap": (1, INT_MAX, ""),
    "batch_num_per_client": (1, INT_MAX, ""),
    "ig_tv": (0.0, HUGE, ""),
    "dp_quantile": Range(TINY, 1.0, "a quantile of the clients' update norms", hi_open=True),
    "server_momentum": Range(0.0, 1.0, "", hi_open=True),
    "server_beta2": Range(0.0, 1.0, "", hi_open=True),
    "rand_percent": (1, 100, "a percentage of the local data"),
    "layer_idx": (0, INT_MAX, ""),
    "ala_layers": (0, INT_MAX, ""),
    "trim_frac": Range(0.0, 0.5, "trimmed at each end", hi_open=True),
    "cclip_tau": (TINY, HUGE, ""),
    "cclip_iters": (1, INT_MAX, ""),
    "norm_bound": (TINY, HUGE, ""),
    "attack_frac": Range(TINY, 1.0, "an attack must leave a benign client", hi_open=True),
    "backdoor_target": (0, INT_MAX, "a label"),
    "backdoor_frac": (TINY, 1.0, "a share of a batch"),
    "trigger_size": (1, INT_MAX, "pixels"),
}
RANGES = {k: Range(*v) for k, v in RANGES.items()}


def _shown(v: float) -> str:
    if isinstance(v, float):
        return f"{v:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    if v == 2 ** 31 - 1:
        return "2^31 - 1"
    k = len(str(v)) - 1
    return f"10^{k}" if v >= 10 ** 5 and v == 10 ** k else str(v)


def numeric_actions(parser) -> list:
    """The parser's flags that take an int or a float."""
    return [a for a in parser.flags if a.type in (int, float) or getattr(a.type, "__name__", "") == "finite_float"]


def _bounds(r: Range) -> str:
    return f"{'(' if r.lo_open else '['}{_shown(r.lo)}, {_shown(r.hi)}{')' if r.hi_open else ']'}"


def rule(action) -> str:
    """The accepted range of one flag, in words."""
    if action.choices is not None:  # argparse refuses any other value
        return "one of " + ", ".join(_shown(c) for c in action.choices)
    if action.dest in RANGES:
        r = RANGES[action.dest]
        shown = _bounds(r)
        if action.type is not int and r.lo == 0 and not r.lo_open:  # no float takes a magnitude under TINY
            shown = f"0, or {_bounds(r._replace(lo=TINY))}"
        elif r.zero:
            shown = f"0, or {shown}"
        return shown + (f" ({r.why})" if r.why else "")
    if action.type is int:
        return f"[-{_shown(INT_MAX)}, {_shown(INT_MAX)}]"
    return f"0, or magnitude in [{_shown(TINY)}, {_shown(HUGE)}]"


def accepts(action, v) -> bool:
    """Whether the numeric flag ``action`` takes the value ``v``."""
    floating = action.type is not int
    if action.choices is not None:
        return v in action.choices
    if floating and (not math.isfinite(v) or (v != 0 and abs(v) < TINY)):
        return False
    r = RANGES.get(action.dest)
    if r is None:
        return abs(v) <= (HUGE if floating else INT_MAX)
    if v == 0 and r.zero:
        return True
    return (r.lo < v if r.lo_open else r.lo <= v) and (v < r.hi if r.hi_open else v <= r.hi)


def check(args, actions) -> None:
    """Refuse (one line) a numeric flag's value outside its range."""
    for a in actions:
        v = getattr(args, a.dest, None)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not accepts(a, v):
            flag = a.option_strings[0]
            raise FLError(f"{flag} {v:g} is out of range: it takes {rule(a)}" if isinstance(v, float)
                          else f"{flag} {v} is out of range: it takes {rule(a)}")


def markdown(parsers) -> str:
    """The table of docs/security.md: every numeric flag of ``parsers`` (the common parser and every
    algorithm's: scripts/dev/docs_tables.py passes them, since utilities import neither the command line nor
    an algorithm)."""
    rows: dict[str, tuple[str, str, str]] = {}
    for parser in parsers:
        for a in numeric_actions(parser):
            if a.dest not in rows:
                rows[a.dest] = (" / ".join(a.option_strings), "int" if a.type is int else "float", rule(a))
    lines = ["| flag | type | accepted |", "|---|---|---|"]
    lines += [f"| `{f}` | {t} | {r} |" for f, t, r in sorted(rows.values(), key=lambda r: r[0].lstrip("-").lower())]
    return "\n".join(lines)
