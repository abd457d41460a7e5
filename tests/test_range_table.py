"""The range table (utils/bounds.py) is the one place a numeric flag's range is declared and enforced
(Hypothesis, derandomized): for every numeric flag of the common parser and of every algorithm, a value
outside its declared range is refused by the command line with one line naming the flag and exit code 2, and
for every common flag a value inside it passes every check of ``cli.parse_config`` (with the other flags a
relational check needs), so no second check narrows the table. ``FUZZ_SCALE=K`` runs K times each budget
(tests/test_fuzz_readers.py's convention)."""
from __future__ import annotations

import contextlib
import io
import math
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cli as cli_module
import main
from conftest import SANDBOX, cli
from flcore.registry import ALGORITHMS
from test_fuzz_readers import budget
from utils import bounds
from utils.errors import FLError

OUT = SANDBOX / "ranges"  # under the session's temporary folder, which conftest removes at the end
OUT.mkdir(exist_ok=True)


def _flags(parser) -> dict:
    return {a.dest: a for a in bounds.numeric_actions(parser)}


COMMON = _flags(cli_module.base_parser())
OWN = {}  # an algorithm's own numeric flags, each under the first algorithm declaring it
for _name in ALGORITHMS:
    for _dest, _a in _flags(cli_module.parser_for(_name)).items():
        if _dest not in COMMON and _dest not in OWN:
            OWN[_dest] = (_name, _a)
EVERY = [(None, a) for a in COMMON.values()] + list(OWN.values())

# the other flags a relational check (cli.validate, a plug-in's check) needs for a flag to be taken at all
NEEDS = {
    "prev": ("-t", "10000"), "attack_frac": ("--attack", "signflip"), "attack_scale": ("--attack", "signflip"),
    "backdoor_target": ("--attack", "backdoor"), "backdoor_frac": ("--attack", "backdoor"),
    "trigger_size": ("--attack", "backdoor"), "krum_f": ("--aggregator", "krum"),
    "cclip_tau": ("--aggregator", "cclip"), "cclip_iters": ("--aggregator", "cclip"),
    "norm_bound": ("--aggregator", "normclip"),
}
NEEDS_OPTIONAL = {"dp_quantile": "opacus"}  # -dp --dp_level client: the accountant's package


def text(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def outside(a):
    """Values a flag's range refuses."""
    r = bounds.RANGES.get(a.dest)
    if a.choices is not None:
        return st.integers(-2 ** 70, 2 ** 70).filter(lambda v: v not in a.choices)
    if a.type is int:
        lo, hi = (r.lo, r.hi) if r else (-bounds.INT_MAX, bounds.INT_MAX)
        return st.integers(-2 ** 70, lo - 1) | st.integers(hi + 1, 2 ** 70)
    tiny = st.floats(-bounds.TINY, bounds.TINY, exclude_min=True, exclude_max=True).filter(lambda v: v != 0)
    if r is None:
        return tiny | st.floats(bounds.HUGE, 1e300, exclude_min=True).flatmap(lambda v: st.sampled_from([v, -v]))
    below = st.floats(-1e300, r.lo, exclude_max=not r.lo_open).filter(lambda v: not (v == 0 and r.zero))
    above = st.floats(r.hi, 1e300, exclude_min=not r.hi_open)
    return below.filter(lambda v: v < r.lo or (r.lo_open and v == r.lo)) | above | tiny


def inside(a):
    """Values a flag's range takes."""
    r = bounds.RANGES.get(a.dest)
    if a.choices is not None:
        return st.sampled_from(a.choices)
    if a.type is int:
        lo, hi = (r.lo, r.hi) if r else (-bounds.INT_MAX, bounds.INT_MAX)
        if a.dest == "prev":
            hi -= 1  # below -t, which goes up to the same bound
        return st.integers(lo, hi)
    if r is None:
        mag = st.floats(bounds.TINY, bounds.HUGE)
        return st.just(0.0) | mag | mag.map(lambda v: -v)
    span = st.floats(max(r.lo, bounds.TINY) if r.lo >= 0 else r.lo, r.hi,
                     exclude_min=r.lo_open, exclude_max=r.hi_open).filter(lambda v: v == 0 or abs(v) >= bounds.TINY)
    zero = r.zero or (r.lo == 0 and not r.lo_open)
    return (st.just(0.0) | span) if zero else span


def accepted(cfg):
    raise AssertionError(f"accepted; the run would start: {cfg}")


def refused(argv) -> list[str]:
    """main.main's lines and exit code for ``argv``, refused before any run (a run is not started)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            mock.patch.object(main, "run", accepted):
        try:
            rc = main.main(argv)
        except SystemExit as e:  # argparse's own refusals (a choice, a number that is not finite): one line
            rc = e.code
    assert rc == 2, (argv, err.getvalue())
    return err.getvalue().strip().splitlines()


@budget(80)
@given(data=st.data())
def test_a_value_outside_a_flags_range_is_one_line_and_exit_2(data):
    algo, a = data.draw(st.sampled_from(EVERY), label="flag")
    value = data.draw(outside(a), label="value")
    assert not bounds.accepts(a, value)
    flag = a.option_strings[-1]
    lines = refused(cli(OUT, OUT, *(("-algo", algo) if algo else ()), f"{flag}={text(value)}"))
    says = "invalid choice" if a.choices is not None else "out of range"
    assert len(lines) == 1 and a.option_strings[0] in lines[0] and says in lines[0], lines


@budget(40)
@given(data=st.data())
def test_a_value_inside_a_common_flags_range_passes_every_check(data):
    a = data.draw(st.sampled_from(sorted(COMMON.values(), key=lambda a: a.dest)), label="flag")
    if a.dest in NEEDS_OPTIONAL:
        pytest.importorskip(NEEDS_OPTIONAL[a.dest])
    value = data.draw(inside(a), label="value")
    assert bounds.accepts(a, value)
    extra = [*NEEDS.get(a.dest, ()), *(("-dp", "--dp_level", "client") if a.dest == "dp_quantile" else ())]
    with contextlib.redirect_stderr(io.StringIO()):
        cfg = cli_module.parse_config(cli(OUT, OUT, *extra, f"{a.option_strings[-1]}={text(value)}"))
    assert getattr(cfg, a.dest) == value or (a.dest == "server_learning_rate" and value is not None)


def test_the_table_names_only_flags_that_exist_and_its_bounds_are_ordered():
    every = set(COMMON) | set(OWN)
    assert set(bounds.RANGES) <= every, set(bounds.RANGES) - every
    for dest, r in bounds.RANGES.items():
        assert r.lo < r.hi and not math.isnan(r.lo + r.hi), dest


def test_no_check_but_the_tables_refuses_a_common_flags_value_in_range_at_its_bounds():
    """Every bound itself (or the closest value taken, at an open end), through the whole of parse_config."""
    for a in COMMON.values():
        r = bounds.RANGES.get(a.dest)
        if r is None or a.dest in NEEDS_OPTIONAL:
            continue
        ends = [r.lo if not r.lo_open else math.nextafter(r.lo, math.inf),
                (r.hi if not r.hi_open else math.nextafter(r.hi, -math.inf)) - (a.dest == "prev")]
        for v in ends:
            v = int(v) if a.type is int else float(v)
            if a.type is not int and v != 0 and abs(v) < bounds.TINY:
                v = bounds.TINY
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    cli_module.parse_config(cli(OUT, OUT, *NEEDS.get(a.dest, ()), f"{a.option_strings[-1]}={text(v)}"))
            except FLError as e:
                pytest.fail(f"{a.option_strings[0]} {v}: {e}")
