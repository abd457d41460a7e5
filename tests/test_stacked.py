"""runtime/stacked.py's helpers by hand: stacking per-client values leaf by leaf, vmap's in_dims for them, and
the schedule of a stacked phase's steps. (The stacked phase's numbers against the sequential loop are
tests/test_batched.py's.)"""
import pytest
import torch

from runtime.stacked import Schedule, dims_tree, signature, stack_tree


def test_a_tree_of_one_structure_is_stacked_leaf_by_leaf():
    a = {"h": torch.tensor([1.0, 2.0]), "pair": (torch.tensor(3.0), 7), "steps": 4}
    b = {"h": torch.tensor([5.0, 6.0]), "pair": (torch.tensor(8.0), 7), "steps": 4}
    out = stack_tree([a, b])
    assert out.keys() == {"h", "pair", "steps"} and isinstance(out["pair"], tuple)
    assert torch.equal(out["h"], torch.tensor([[1.0, 2.0], [5.0, 6.0]]))
    assert torch.equal(out["pair"][0], torch.tensor([3.0, 8.0])) and out["pair"][1] == 7 and out["steps"] == 4
    assert dims_tree(out) == {"h": 0, "pair": (0, None), "steps": None}
    assert dims_tree([torch.zeros(2), [3, torch.ones(1)]]) == [0, [None, 0]]


def test_one_client_stacks_alone():
    out = stack_tree([{"h": torch.tensor([1.0, 2.0]), "steps": 3}])
    assert torch.equal(out["h"], torch.tensor([[1.0, 2.0]])) and out["steps"] == 3


def test_plain_values_must_agree_between_clients():
    assert stack_tree([2, 2, 2]) == 2 and stack_tree(["x", "x"]) == "x"
    with pytest.raises(ValueError, match="a batch_state value of type int differs between clients"):
        stack_tree([2, 3])


def test_a_stack_holds_no_graph():
    """A client's state tensor that requires grad (a parameter) is stacked detached: the stack is the
    stacked step's input, not a node of any client's graph."""
    w = torch.nn.Parameter(torch.ones(2))
    out = stack_tree([w * 2, w])
    assert not out.requires_grad and out.grad_fn is None


def test_a_signature_is_the_class_and_every_entrys_name_shape_and_dtype():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    assert signature(a) == signature(b) == ("Linear", (("weight", (2, 3), torch.float32), ("bias", (2,), torch.float32)))
    assert signature(torch.nn.Linear(3, 2, bias=False)) != signature(a)
    assert signature(a.double()) != signature(b)


def test_a_schedule_of_no_clients_has_no_steps():
    s = Schedule([], [], 4, torch.device("cpu"))
    assert s.length == 0 and s.n == 0 and s.index.shape == (0, 0, 4)
