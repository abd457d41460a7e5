"""runtime/stacked.py's helpers by hand: stacking per-client values leaf by leaf, vmap's in_dims for them, and
the schedule of a stacked phase's steps. (The stacked phase's numbers against the sequential loop are
tests/test_batched.py's.)"""
import pytest
import torch

from conftest import build_server
from runtime import graphs
from runtime.stacked import (Schedule, TrainPhase, _with_state, concat_offsets, dims_tree, objective_identity,
                             objective_modules, plan_phase, predict_many, rows_of, signature, stack_tree)
from utils.errors import Diverged


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
    assert signature(a) == signature(b) == ("Linear", (("weight", (2, 3), torch.float32),
                                                       ("bias", (2,), torch.float32)))
    assert signature(torch.nn.Linear(3, 2, bias=False)) != signature(a)
    assert signature(a.double()) != signature(b)


def test_a_schedule_of_no_clients_has_no_steps():
    s = Schedule([], [], 4, torch.device("cpu"))
    assert s.length == 0 and s.n == 0 and s.index.shape == (0, 0, 4)


def test_a_schedule_places_each_full_batch_at_its_own_step():
    """Full batches at steps 0, 1, 3 and 5 and smaller ones between (a client's batches as given, in any
    order): each full batch's indices sit at its own step, offset by the client's start in the concatenation;
    the steps of the smaller ones run them apart, as their own group."""
    full = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7])]
    part = [torch.tensor([8]), torch.tensor([9])]
    batches = [[full[0], full[1], part[0], full[2], part[1], full[3]], [torch.tensor([0, 1])]]
    s = Schedule(batches, [0, 10], 2, torch.device("cpu"))
    assert s.order == [0, 1] and s.count == [6, 1] and s.length == 6
    for step, b in zip((0, 1, 3, 5), full):
        assert torch.equal(s.index[step, 0], b)
    assert torch.equal(s.index[0, 1], torch.tensor([10, 11]))
    assert [r for r, _ in s.steps(0)] == [slice(0, 2)] and s.full[1] == slice(0, 1) and s.full[2] is None
    (rows, idx), = list(s.steps(2))
    assert rows == slice(0, 1) and torch.equal(idx, torch.tensor([[8]]))
    late = Schedule([[part[0], part[1], full[0], full[1], part[0], full[2]]], [0], 2, torch.device("cpu"))
    for step, b in zip((2, 3, 5), full):  # full batches from step 2 on
        assert torch.equal(late.index[step, 0], b)


def test_a_phase_is_planned_only_for_plain_sgd_over_the_declared_modules(digits_tiny_root):
    """plan_phase's refusals, each its own line, and the plan of a plain SGD phase: every trainable entry of
    the declared modules at its group's rate (a frozen one left out), the client's own batch size in its key."""
    client = build_server(digits_tiny_root, digits_tiny_root).clients[0]
    params = list(client.model.parameters())
    sgd = torch.optim.SGD
    assert plan_phase(client, 1, None, torch.optim.Adam(params), None, None) == "its optimizer is Adam, not plain SGD"
    nesterov = sgd(params, lr=0.1)
    nesterov.param_groups[0]["nesterov"] = True
    for opt in (sgd(params, lr=0.1, momentum=0.5), sgd(params, lr=0.1, weight_decay=1e-4), nesterov,
                sgd(params, lr=0.1, maximize=True)):
        assert plan_phase(client, 1, None, opt, client.loss, None) == ("its SGD has momentum, weight decay, "
                                                                       "Nesterov or maximize")
    outside = sgd([*params, torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    assert plan_phase(client, 1, None, outside, client.loss, None) == ("its optimizer trains a parameter outside "
                                                                       "its dp_modules")
    params[0].requires_grad_(False)
    plan = plan_phase(client, 1, None, sgd([{"params": params[:2], "lr": 0.05}, {"params": params[2:], "lr": 0.2}]),
                      client.loss, None)
    names = [f"model.{n}" for n, _ in client.model.named_parameters()]
    assert plan.trained == {names[1]: 0.05, **{n: 0.2 for n in names[2:]}} and plan.own
    assert plan.key[0] == "train" and plan.key[6] == client.cfg.batch_size == 20 and plan.key[7] == (1, 8, 8)
    assert len(plan.batches) == -(-len(client.x_train) // 20)
    seven = plan_phase(client, 2, 7, sgd(params[1:], lr=0.1), client.loss, None)
    assert len(seven.batches) == 2 * -(-len(client.x_train) // 7) and seven.key[6] == 7


def test_an_objective_reads_the_declared_modules_and_those_its_closure_holds_each_once(digits_tiny_root):
    client = build_server(digits_tiny_root, digits_tiny_root).clients[0]
    copy = torch.nn.Linear(2, 2)
    same = client.model

    def objective(x, y):
        return copy(x).sum() + same(x).sum()

    assert objective_modules(client, objective) == {"model": client.model, "closure_copy": copy}
    assert objective_modules(client, client.loss) == {"model": client.model}


def test_rows_and_offsets():
    assert rows_of(slice(0, 3), 5) == [0, 1, 2] and rows_of(torch.tensor([4, 1]), 5) == [4, 1]
    assert concat_offsets([torch.zeros(3), torch.zeros(0), torch.zeros(2)]) == [0, 3, 3]


def test_an_objectives_identity_is_its_function():
    """Bound methods of one class are one objective whatever client they are bound to; two plain functions
    are two, and closures of one definition are one (what they hold is stacked as modules, not compared)."""
    class A:
        def loss(self, x, y):
            return x

    def f(x, y):
        return x

    def g(x, y):
        return y

    def make(m):
        return lambda x, y: m(x)

    assert objective_identity(A().loss) == objective_identity(A().loss) == A.loss
    assert objective_identity(f) == f.__code__ != objective_identity(g)
    assert objective_identity(make(1)) == objective_identity(make(2))


def test_a_loss_sees_the_stacked_state_for_its_call_only():
    class Obj:
        anchor, other = 1, "kept"

    obj = Obj()
    seen = _with_state(obj, {"anchor": 2}, lambda: (obj.anchor, obj.other))
    assert seen == (2, "kept") and obj.anchor == 1
    with pytest.raises(RuntimeError):
        _with_state(obj, {"anchor": 3}, lambda: (_ for _ in ()).throw(RuntimeError("loss failed")))
    assert obj.anchor == 1


def test_a_phase_stacks_each_clients_entries_and_state_without_a_graph(digits_tiny_root):
    """FedProx's clients, each with its own anchor (its batch_state): the phase's stacks hold each client's
    trained entries, other entries and state row by row, detached (the stacked step is functional: a stack
    tracked by autograd would only hold a graph)."""
    clients = build_server(digits_tiny_root, digits_tiny_root, "-algo", "FedProx").clients[:2]
    for i, c in enumerate(clients):
        c.anchor = [a + i for a in c.anchor]
    # the phase trains all but the first two parameters: those are the stack's constant entries
    plans = [plan_phase(c, 1, None, torch.optim.SGD(list(c.model.parameters())[2:], lr=0.1), c.loss, None)
             for c in clients]
    phase = TrainPhase(plans)
    assert list(phase.state) == ["anchor"] and phase.names == list(plans[0].trained)
    names = [f"model.{n}" for n, _ in clients[0].model.named_parameters()]
    assert list(phase.const) == names[:2] and sorted(phase.train) == sorted(names[2:])
    for r, c in enumerate(clients):
        for a, stacked in zip(c.anchor, phase.state["anchor"]):
            assert torch.equal(stacked[r], a)
        for n, p in c.model.named_parameters():
            assert torch.equal({**phase.train, **phase.const}[f"model.{n}"][r], p.detach())
    assert all(not t.requires_grad for t in [*phase.train.values(), *phase.const.values()])


def sgd_plans(clients, epochs: int, batch_size: int | None = None, objective=None) -> list:
    """Each client's phase of plain SGD (rate 0.1) over its whole model on ``objective`` (its own loss)."""
    return [plan_phase(c, epochs, batch_size, torch.optim.SGD(c.model.parameters(), lr=0.1),
                       c.loss if objective is None else objective, None) for c in clients]


@pytest.mark.parametrize("graphed", [False, True])
def test_a_phase_returns_each_clients_mean_batch_loss_as_its_own_loop_does(graphed, digits_tiny_root):
    """Four clients of unequal sizes (37-98 samples, batches of 20: a last batch of its own size each, so the
    stack's steps take whole prefixes and scattered rows): each client's returned loss is the mean of its batch
    losses and its model the one its own loop trains, both from a plain torch loop over the same batches;
    ``graphed``: the step CUDA graphs capture (all rows, the rows without a full batch masked), run eagerly."""
    clients = build_server(digits_tiny_root, digits_tiny_root).clients[:4]
    plans = sgd_plans(clients, 2)
    assert len({len(c.x_train) for c in clients}) == 4
    expected_loss, expected_params = [], []
    for c, p in zip(clients, plans):
        start = {n: t.detach().clone() for n, t in c.model.named_parameters()}
        opt, losses = torch.optim.SGD(c.model.parameters(), lr=0.1), []
        for idx in p.batches:
            opt.zero_grad()
            loss = c.loss(c.x_train[idx], c.y_train[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        expected_loss.append(sum(losses) / len(losses))
        expected_params.append({n: t.detach().clone() for n, t in c.model.named_parameters()})
        with torch.no_grad():
            for n, t in c.model.named_parameters():
                t.copy_(start[n])
    cache = graphs.CudaGraphs(capture=False) if graphed else None
    assert TrainPhase(plans, cache).run() == pytest.approx(expected_loss, rel=1e-5)
    assert not graphed or (cache.cache and not cache.broken)
    for c, want in zip(clients, expected_params):
        for n, t in c.model.named_parameters():
            torch.testing.assert_close(t.detach(), want[n], rtol=1e-5, atol=1e-6)


def test_a_phase_of_no_steps_takes_no_graph_and_returns_zero_losses(digits_tiny_root):
    """Zero epochs: no batch at all, so no step whose shapes a graph could be captured for; every loss is 0."""
    clients = build_server(digits_tiny_root, digits_tiny_root).clients[:2]
    plans = sgd_plans(clients, 0)
    cache = graphs.CudaGraphs(capture=False)
    assert TrainPhase(plans, cache).run() == [0.0, 0.0] and not cache.cache


def test_a_phase_of_one_step_returns_that_steps_loss(digits_tiny_root):
    """One epoch in one batch of all of each client's samples (at most 98): each loss is that batch's loss
    under the client's model before the step, computed here directly."""
    clients = build_server(digits_tiny_root, digits_tiny_root).clients[:2]
    with torch.no_grad():
        expected = [c.loss(c.x_train, c.y_train).item() for c in clients]
    plans = sgd_plans(clients, 1, 100)
    assert [len(p.batches) for p in plans] == [1, 1]
    assert TrainPhase(plans).run() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), 3e38])
def test_a_client_whose_loss_is_not_finite_gets_its_own_error_and_the_others_their_loss(bad, digits_tiny_root):
    """The loss is the model's on clipped inputs times the largest input: a NaN sample makes the second
    client's loss NaN, a sample of 3e38 makes it infinite (a finite loss times 3e38 overflows). Its entry is
    the Diverged error naming it and its learning rate; the first client's is its loss, as if trained alone."""
    def phase(clients):
        def objective(x, y):  # the phase runs its first client's objective on every client's entries
            return clients[0].loss(x.clamp(-5, 5), y) * x.abs().amax()
        return TrainPhase(sgd_plans(clients, 1, 100, objective))

    alone = phase(build_server(digits_tiny_root, digits_tiny_root).clients[:1]).run()
    clients = build_server(digits_tiny_root, digits_tiny_root).clients[:2]
    clients[1].x_train = clients[1].x_train.clone()
    clients[1].x_train[0] = bad
    first, second = phase(clients).run()
    assert first == pytest.approx(alone[0], rel=1e-6)
    assert isinstance(second, Diverged)
    assert str(second).startswith(f"client {clients[1].id}: training loss became ")
    assert "lower -lr (now 0.1" in str(second)


def test_predicting_many_models_gives_each_its_own_logits_in_eval_mode():
    """Three models of one architecture, left in train mode, on 5, 1 and 0 samples (the last two shorter than
    any chunk, so their chunks are padded, and the one-sample client is the last in the stacked inputs): each
    model's logits on its own inputs, as its own forward gives them, and every model in eval mode after."""
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)) for _ in range(3)]
    xs = [torch.randn(5, 4), torch.randn(1, 4), torch.randn(0, 4)]
    out = predict_many(models, xs, batch_size=4)
    assert all(not m.training for m in models)
    with torch.no_grad():
        for m, x, got in zip(models, xs, out):
            assert got.shape == (len(x), 3)
            torch.testing.assert_close(got, m(x))
