"""runtime/checkpoint.py's checks of a checkpoint before anything is loaded, by hand: which recorded values
count as numbers (as ``state.encode`` saves them), the recorded series' shape and rounds, the checkpoint's
round, when a saved plain value is the run's, (through ``load``) whose run it holds, and which errors of a
resumed run's rounds are blamed on its checkpoint."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import build_server
from runtime import checkpoint, state
from utils.errors import FLError


def server(rounds: int = 3):
    """What the value checks read of a server: its -gr."""
    return SimpleNamespace(cfg=SimpleNamespace(global_rounds=rounds))


SERVER = server()


def damaged(what: str) -> str:
    """The one line a damaged checkpoint ``c.ckpt`` is refused with, as a pattern."""
    return rf"^checkpoint c\.ckpt is damaged \({what}\); delete it to start over$"


def ckpt(series=None, round_time=(0.5, 0.25)) -> dict:
    """A checkpoint after round 1 whose recorder holds ``series`` (two evaluations: rounds 0 and 1)."""
    series = {"rs_round": [0, 1], "rs_test_acc": [0.5, 0.75], **(series or {})}
    return {"round": 1, "recorder": {"series": series, "round_time": list(round_time)}}


def encoded(value):
    return state.encode(value, {}, "recorder")


@pytest.mark.parametrize("series, round_time", [
    ({}, (0.5, 0.25)),
    ({}, (encoded(np.float64(0.5)), 1)),  # a numpy scalar, as the recorder's encoding saves one
    ({"rs_client_test_acc": [[0.5, 1.0], [0.25, 0.0]]}, (0.5, 0.25)),  # per-client values as lists
    ({"rs_client_test_acc": [encoded(np.array([0.5, 1.0])), torch.tensor([0.25, 0.0])]}, (0.5, 0.25)),
    ({"rs_test_acc": [encoded(np.float32(0.5)), 0.75]}, (0.5, 0.25)),
])
def test_recorded_numbers_in_every_form_the_encoding_saves_are_accepted(series, round_time):
    checkpoint.check_values(ckpt(series, round_time), SERVER, "c.ckpt")


@pytest.mark.parametrize("series, round_time", [
    ({}, ({state.KIND: "numpy_scalar", "value": "0.5"}, 0.25)),  # a numpy scalar whose value is text
    ({}, ([0.5], 0.25)),  # a round's time is one number, not a list
    ({}, (encoded(np.array([0.5])), 0.25)),
    ({"rs_client_test_acc": [torch.zeros(2, 2), torch.zeros(2)]}, (0.5, 0.25)),  # per client: 1-d only
    ({"rs_client_test_acc": [torch.zeros(2, dtype=torch.complex64), torch.zeros(2)]}, (0.5, 0.25)),
    ({"rs_client_test_acc": [[0.5, "1"], [0.25, 0.0]]}, (0.5, 0.25)),
    ({"rs_client_test_acc": [{state.KIND: "ndarray", "data": "0.5"}, [0.25]]}, (0.5, 0.25)),
    ({"rs_test_acc": [{"value": 0.5}, 0.75]}, (0.5, 0.25)),  # a dict that is no encoded number
])
def test_a_recorded_value_that_is_not_a_number_is_refused_with_one_line(series, round_time):
    with pytest.raises(FLError, match=damaged("its recorded series are not lists of numbers")):
        checkpoint.check_values(ckpt(series, round_time), SERVER, "c.ckpt")


@pytest.mark.parametrize("saved, mine, same", [
    (1, 1, True), ("FedAvg", "FedAvg", True), ([1, 2], [1, 2], True),
    (1, 1.0, False), (True, 1, False), ([1], 1, False), ("1", 1, False),  # another type is another value
    (torch.zeros(2), torch.zeros(3), False),  # a comparison that raises (shapes) is a difference, not an error
    (torch.zeros(2), torch.zeros(2), False),  # an element-wise comparison has no single truth value
    (np.zeros(2), np.zeros(2), False),
    (torch.zeros(1), torch.zeros(1), True),
])
def test_a_saved_plain_value_is_the_runs_only_with_its_type_and_value(saved, mine, same):
    assert checkpoint._same(saved, mine) is same


@pytest.mark.parametrize("rnd, rounds, refused", [
    (-1, 3, None), (0, 3, None), (2, 3, None),  # -1: saved before round 0; -gr 3 trains rounds 0 to 2
    (-2, 3, damaged("round -2")), (True, 3, damaged("round True")),
    (0, 1, None), (1, 1, "holds 2 rounds, more than -gr 1"),  # -gr 1 trains round 0 only
    (0, 0, None), (1, 0, "holds 2 rounds, more than -gr 0"),  # the bound is at least one round
])
def test_a_checkpoints_round_is_a_whole_number_from_before_round_0_to_the_last_of_gr(rnd, rounds, refused):
    c = {"round": rnd, "recorder": None}
    if refused is None:
        checkpoint.check_values(c, server(rounds), "c.ckpt")
    else:
        with pytest.raises(FLError, match=refused):
            checkpoint.check_values(c, server(rounds), "c.ckpt")


def test_loading_checks_whose_run_and_which_values_a_checkpoint_holds(digits_tiny_root, tmp_path):
    """Through ``load``: a checkpoint of this server loads; one whose identity names another split is refused
    naming the first 20 characters of the saved checksum and this run's; one after more rounds than -gr is
    refused by the value checks; one of an earlier format (1, 2) is named as such, any other format refused.
    """
    run = build_server(digits_tiny_root, tmp_path, "-gr", "2")
    path = tmp_path / "run.ckpt"
    saved = checkpoint.snapshot(run, 0)
    state.write_file(saved, path)
    assert checkpoint.load(path, run)["round"] == 0
    other = "0123456789abcdefghijKLMNOP"
    state.write_file({**saved, "identity": {**saved["identity"], "split": other}}, path)
    with pytest.raises(FLError, match=rf"holds another run \(split '0123456789abcdefghij' -> "
                                      rf"'{run.data.config_hash}'\); drop --resume"):
        checkpoint.load(path, run)
    state.write_file({**saved, "round": 2}, path)
    with pytest.raises(FLError, match=r"holds 3 rounds, more than -gr 2; resume with -gr 3 or more"):
        checkpoint.load(path, run)
    assert saved["format"] == 3  # this version's
    for fmt in (1, 2):  # the earlier versions' formats: named as such
        state.write_file({**saved, "format": fmt}, path)
        with pytest.raises(FLError, match=rf"^checkpoint .*run\.ckpt was written by an earlier version \(format "
                                          rf"{fmt}: it does not say which run it holds\); delete it to start over$"):
            checkpoint.load(path, run)
    for fmt in (0, 4, 2.0, True, "3", None):  # anything else is no checkpoint of this version
        state.write_file({**saved, "format": fmt}, path)
        with pytest.raises(FLError, match=r"^.*run\.ckpt is not a checkpoint of this library version; delete it to "
                                          r"start over$"):
            checkpoint.load(path, run)


def test_recorded_bytes_must_be_lists_of_numbers():
    c = ckpt()
    c["recorder"]["round_bytes"] = {"up": [1, 2], "down": [3, 4]}
    checkpoint.check_values(c, SERVER, "c.ckpt")
    for bad in ({"up": [1, 2], "down": [3, "4"]}, [[1, 2], [3, 4]]):
        c["recorder"]["round_bytes"] = bad
        with pytest.raises(FLError, match=damaged("its recorded bytes are not lists of numbers")):
            checkpoint.check_values(c, SERVER, "c.ckpt")


def test_each_series_has_one_entry_per_evaluation_of_its_own_index():
    """A tagged series (``rs_<tag>_...``, e.g. the new clients' evaluations) is indexed by ``rs_<tag>_round``,
    every other one by ``rs_round``."""
    tagged = {"rs_new_round": [1], "rs_new_test_acc": [0.5]}
    checkpoint.check_values(ckpt(tagged), SERVER, "c.ckpt")
    # a tag of any length; a series whose name only begins like another series' is indexed by rs_round
    checkpoint.check_values(ckpt({"rs_later_round": [1], "rs_later_test_acc": [0.5], "rs_te_x": [0.5, 0.25]}),
                            SERVER, "c.ckpt")
    with pytest.raises(FLError, match=damaged("series rs_new_test_acc has 2 entries for 1 evaluations")):
        checkpoint.check_values(ckpt({**tagged, "rs_new_test_acc": [0.5, 0.25]}), SERVER, "c.ckpt")
    with pytest.raises(FLError, match=damaged("series rs_train_loss has 1 entries for 2 evaluations")):
        checkpoint.check_values(ckpt({"rs_train_loss": [0.5]}), SERVER, "c.ckpt")
    long = "rs_" + "x" * 37 + "yz"  # a series name of 42 characters is named by its first 40
    with pytest.raises(FLError, match=damaged(f"series {long[:40]} has 1 entries for 2 evaluations")):
        checkpoint.check_values(ckpt({long: [0.5]}), SERVER, "c.ckpt")


@pytest.mark.parametrize("key, rounds", [("rs_round", [1, 0]), ("rs_round", [0, 2]), ("rs_round", [-1, 0]),
                                         ("rs_round", [0, 1.0]), ("rs_new_round", [2]), ("rs_new_round", [1, 1])])
def test_the_rounds_of_a_series_increase_up_to_the_checkpoints_round(key, rounds):
    """After round 1: every index is whole, increasing rounds from 0, none after round 1."""
    series = {key: rounds} if key == "rs_round" else {key: rounds, "rs_new_test_acc": [0.5] * len(rounds)}
    with pytest.raises(FLError, match=damaged(f"{key} is not increasing rounds up to its round 1")):
        checkpoint.check_values(ckpt(series), SERVER, "c.ckpt")


def test_a_resumed_runs_misfit_errors_are_blamed_on_its_checkpoint_and_no_others():
    """An error a misfit state raises (``checkpoint.MISFIT``: a TypeError, ValueError, IndexError, AttributeError,
    KeyError or RuntimeError) in a resumed run becomes one line naming the checkpoint; a run's own FLError, any
    other error, and every error of a run that was not resumed stay as they are (None)."""
    resumed = SimpleNamespace(checkpoints=SimpleNamespace(resumed="c.ckpt"))
    for error in (ValueError("shapes differ\nmore lines"), IndexError("index 9 out of range"), KeyError("w"),
                  TypeError(""), AttributeError("x"), RuntimeError("size mismatch")):
        line = state.first_line(error)
        blamed = checkpoint.blame(resumed, error)
        assert isinstance(blamed, FLError) and str(blamed) == (
            f"checkpoint c.ckpt does not fit this run ({type(error).__name__}: {line} after it was restored); "
            f"delete it to start over")
    assert str(checkpoint.blame(resumed, TypeError(""))).startswith("checkpoint c.ckpt does not fit this run "
                                                                  "(TypeError: TypeError after")
    for error in (FLError("the run's own line"), ZeroDivisionError("x"), OSError("disk full"), KeyboardInterrupt()):
        assert checkpoint.blame(resumed, error) is None, error
    for fresh in (SimpleNamespace(checkpoints=SimpleNamespace(resumed=None)), SimpleNamespace()):
        assert checkpoint.blame(fresh, ValueError("shapes differ")) is None


def _slots(series: dict, round_time: list) -> list[tuple]:
    """Every place of a recorded checkpoint that holds a number: (container, key) pairs."""
    places = [(round_time, i) for i in range(len(round_time))]
    for values in series.values():
        for i, v in enumerate(values):
            places += [(v, j) for j in range(len(v))] if isinstance(v, list) else [(values, i)]
    return places


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(acc=st.lists(st.floats(0, 1), min_size=2, max_size=2), per_client=st.integers(1, 4),
       pick=st.floats(0, 1, exclude_max=True), flag=st.booleans())
def test_true_or_false_in_any_number_slot_of_a_recorder_is_refused(acc, per_client, pick, flag):
    """The class, not one case: a JSON bool is an int to Python, so each slot a checkpoint's recorder reads as a
    number (a round, a metric, a per-client entry, a round's time) is checked to refuse true and false."""
    series = {"rs_round": [0, 1], "rs_test_acc": list(acc), "rs_client_test_acc": [[0.5] * per_client] * 2}
    series = {k: [list(v) if isinstance(v, list) else v for v in vs] for k, vs in series.items()}
    round_time = [0.5, 0.25]
    recorded = {"round": 1, "recorder": {"series": series, "round_time": round_time}}
    checkpoint.check_values(recorded, SERVER, "c.ckpt")
    places = _slots(series, round_time)
    holder, key = places[int(pick * len(places))]
    holder[key] = flag  # in place: the checkpoint holds these very lists
    with pytest.raises(FLError, match=r"^checkpoint c\.ckpt is damaged \("):
        checkpoint.check_values(recorded, SERVER, "c.ckpt")
