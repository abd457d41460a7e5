"""Every numeric flag's accepted range, in one table, enforced in one place (``check``, called by
cli.parse_config once the flags are parsed) and written out in docs/security.md ("Numeric flags",
``markdown``; a test keeps the two equal).

A flag listed in ``RANGES`` takes values in [lo, hi]. Every other integer flag (an algorithm's own among
them) takes values up to ``INT_MAX`` in magnitude, and every other float flag 0 or a magnitude in
[``TINY``, ``HUGE``]: what float32 training can take (a weight of 1e300 overflows float32, whose largest
value is 3.4e38, and 1e-300 underflows to 0 or to a denormal that makes a division blow up). Lower bounds
that depend on other flags (``-pv < -t``, ``-jr`` in (0, 1], an attack's fraction) stay in cli.validate.
"""
from __future__ import annotations

import math

from utils.errors import FLError

INT_MAX = 10 ** 9
TINY, HUGE = 1e-30, 1e6

# dest -> (lowest, highest, why the bound): both inclusive.
RANGES: dict[str, tuple[float, float, str]] = {
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
}


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


def rule(action) -> str:
    """The accepted range of one flag, in words."""
    if action.dest in RANGES:
        lo, hi, why = RANGES[action.dest]
        return f"[{_shown(lo)}, {_shown(hi)}]" + (f" ({why})" if why else "")
    if action.type is int:
        return f"[-{_shown(INT_MAX)}, {_shown(INT_MAX)}]"
    return f"0, or magnitude in [{_shown(TINY)}, {_shown(HUGE)}]"


def check(args, actions) -> None:
    """Refuse (one line) a numeric flag's value outside its range."""
    for a in actions:
        v = getattr(args, a.dest, None)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        flag = a.option_strings[0]
        if a.dest in RANGES:
            lo, hi, _ = RANGES[a.dest]
            ok = lo <= v <= hi
        elif isinstance(v, int):
            ok = -INT_MAX <= v <= INT_MAX
        else:
            ok = math.isfinite(v) and (v == 0 or TINY <= abs(v) <= HUGE)
        if not ok:
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
