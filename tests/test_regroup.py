"""tests/conftest.py's ``regroup``: the tests that read one result cached in the test process (``shared_run``)
go to one test process (pytest-xdist's ``xdist_group``) and sit side by side, on generated collections."""
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

import conftest


class Item:
    """What ``regroup`` reads of a collected test: its module, and the marks added to it."""

    def __init__(self, module, name):
        self.module, self.name, self.marks, self.nodeid = module, name, [], f"tests/test_x.py::test[{name}]"

    def add_marker(self, mark):
        self.marks.append(mark.mark)

    def iter_markers(self, name):
        return (m for m in self.marks if m.name == name)


def collection(draw_modules):
    """Items of consecutive modules; a module that declares ``shared_run`` names each item's cached run
    (None: it reads none); another declares nothing."""
    items = []
    for declares, names in draw_modules:
        module = SimpleNamespace(shared_run=lambda item: item.name) if declares else SimpleNamespace()
        items += [Item(module, name) for name in names]
    return items


modules = st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from([None, "a", "b", "c"]), max_size=12)),
                   max_size=5)


@settings(max_examples=300, deadline=None)
@given(modules)
def test_regroup_puts_each_named_run_together_within_its_module_and_marks_it(drawn):
    items = collection(drawn)
    before = list(items)
    conftest.regroup(items)
    assert sorted(map(id, items)) == sorted(map(id, before))  # the same tests, none lost or repeated
    assert [i.module for i in items] == [i.module for i in before]  # each module's tests stay where they stand
    for module in {id(i.module): i.module for i in before}.values():
        mine = [i for i in items if i.module is module]
        was = [i for i in before if i.module is module]
        if not hasattr(module, "shared_run"):
            assert mine == was and not any(i.marks for i in mine)
            continue
        # each name's tests side by side, in their order, at the place of the name's first test; the tests
        # without a name keep theirs
        expected, placed = [], set()
        for i in was:
            if i.name is None:
                expected.append(i)
            elif i.name not in placed:
                placed.add(i.name)
                expected += [j for j in was if j.name == i.name]
        assert mine == expected
        for i in mine:
            assert [(m.args, m.kwargs) for m in i.marks] == ([] if i.name is None else [((i.name,), {})])


def test_a_test_reading_a_run_its_module_does_not_name_fails(monkeypatch):
    module = SimpleNamespace(shared_run=lambda item: item.name)
    named, other, unnamed = Item(module, "sequential -gr 2"), Item(module, "behaviour-FedAvg"), Item(module, None)
    conftest.regroup([named, other, unnamed])
    monkeypatch.setattr(conftest, "_RUNNING", [named])
    conftest.reading_shared("sequential -gr 2")
    for item in (other, unnamed):
        monkeypatch.setattr(conftest, "_RUNNING", [item])
        with pytest.raises(AssertionError, match="shared_run"):
            conftest.reading_shared("sequential -gr 2")
    pool = Item(module, conftest.RAY_POOL)  # the one Ray session's tests read their runs in their own process
    conftest.regroup([pool])
    monkeypatch.setattr(conftest, "_RUNNING", [pool])
    conftest.reading_shared("sequential -gr 2")
