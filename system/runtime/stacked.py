"""The batched executor's computations: many clients' work as one stacked computation (``torch.func``).

Three kinds of work, each handed over by a client through the seam in utils/batching.py:

- a training phase (one ``Client.run_epochs`` call): every client's modules are stacked
  (``declares.dp_modules`` plus modules the objective's closure holds), the objective is called through
  ``functional_call`` on one client's modules with the stacked entries swapped in, and
  ``vmap(grad_and_value)`` gives every client's gradient of its own batch at once; the update is the
  client class's ``declares.batch_step`` (plain SGD unless ``after_backward`` changes it);
- an evaluation (``utils.metrics.predict``): the clients' models of one architecture stacked, their test
  samples in chunks;
- one epoch of ALA's weight learning (``ALA._epoch``): the clients' W, Θ_i and Θ top tensors stacked
  (runtime/stacked_ala.py).

Step i runs batch i of every client that has one (``Schedule``): clients are ordered by their number of
steps, so the clients still training are a prefix of the stack and their entries a slice of it (no copy); a
client's smaller last batch of an epoch runs in a separate call with the other clients of that size. Every
client draws its batches from its own stream exactly as the sequential executor does, so the numbers are
the sequential ones up to float rounding (vmap batches the kernels, e.g. convolutions become grouped ones).

On CUDA with CUDA graphs the full-size step (of training, and of ALA's W) is captured once per shape and
replayed: it runs over every client of the stack, those without a full batch at that step masked (their
entries do not move), on fixed buffers (runtime/graphs.py).
"""
from __future__ import annotations

import collections
import dataclasses

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from runtime.graphs import row_mask
from utils.batching import batches, sgd_step
from utils.dp_sgd import dp_modules
from utils.errors import Diverged


# ---- stacking ----------------------------------------------------------------------------------------
def signature(module: nn.Module) -> tuple:
    """What must agree for modules to be stacked: their class and every entry's name, shape and dtype."""
    return (type(module).__name__,
            tuple((n, tuple(t.shape), t.dtype) for n, t in module.state_dict(keep_vars=True).items()))


def stack_tree(values: list):
    """Values of one structure (tensors, lists, tuples, dicts of them) stacked leaf by leaf on a new dim 0."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack([v.detach() for v in values])
    if isinstance(first, dict):
        return {k: stack_tree([v[k] for v in values]) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(stack_tree([v[i] for v in values]) for i in range(len(first)))
    if all(v == first for v in values):
        return first
    raise ValueError(f"a batch_state value of type {type(first).__name__} differs between clients")


def select_tree(tree, rows):
    """The rows ``rows`` (a slice or an index tensor) of every stacked leaf."""
    if isinstance(tree, torch.Tensor):
        return tree[rows]
    if isinstance(tree, dict):
        return {k: select_tree(v, rows) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(select_tree(v, rows) for v in tree)
    return tree


def dims_tree(tree):
    """vmap's in_dims for a stacked tree: 0 for tensors, None for plain values."""
    if isinstance(tree, torch.Tensor):
        return 0
    if isinstance(tree, dict):
        return {k: dims_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(dims_tree(v) for v in tree)
    return None


def write_rows(dst: torch.Tensor, rows, src: torch.Tensor) -> None:
    if isinstance(rows, slice):
        dst[rows].copy_(src)
    else:
        dst.index_copy_(0, rows, src)


# ---- which steps each client takes ------------------------------------------------------------------------
class Schedule:
    """Step i of a stacked computation: per client (in ``order``: most steps first), its i-th batch of
    indices into the concatenation of the clients' samples. ``steps(i)`` gives the groups of rows to run
    at step i: the rows with a full batch (``batch_size`` samples), then one group per other batch size."""

    def __init__(self, batches: list[list[torch.Tensor]], offsets: list[int], batch_size: int, device):
        self.batch_size = batch_size
        self.order = sorted(range(len(batches)), key=lambda c: -len(batches[c]))  # stable: ties keep order
        self.n = len(batches)
        self.count = [len(batches[c]) for c in self.order]  # steps per row
        self.length = self.count[0] if self.count else 0
        full = [[] for _ in range(self.length)]
        other: list[dict] = [collections.defaultdict(list) for _ in range(self.length)]
        # Built on the device from the batches as they are (no copy back to the host, which would wait).
        self.index = torch.zeros(self.length, self.n, batch_size, dtype=torch.long, device=device)
        for r, c in enumerate(self.order):
            at = [i for i, b in enumerate(batches[c]) if len(b) == batch_size]
            if at:
                steps = slice(0, len(at)) if at[-1] == len(at) - 1 else torch.tensor(at, device=device)
                self.index[steps, r] = torch.stack([batches[c][i] for i in at]) + offsets[c]
            for i, b in enumerate(batches[c]):
                if len(b) == batch_size:
                    full[i].append(r)
                else:
                    other[i][len(b)].append((r, b + offsets[c]))
        self.full = [self._rows(rows, device) for rows in full]
        self.full_mask = torch.zeros(self.length, self.n, dtype=torch.bool)
        for i, rows in enumerate(full):
            self.full_mask[i, rows] = True
        self.full_mask = self.full_mask.to(device)
        self.other = [[(self._rows([r for r, _ in g], device), torch.stack([b for _, b in g]).to(device))
                       for _, g in sorted(groups.items())] for groups in other]

    @staticmethod
    def _rows(rows: list[int], device):
        """A slice when the rows are a prefix 0..k-1 (then the stack's entries are a view), else indices."""
        if not rows:
            return None
        if rows == list(range(len(rows))):
            return slice(0, len(rows))
        return torch.tensor(rows, device=device)

    def steps(self, i: int):
        """(rows, sample indices [k, size]) of step ``i``: the full batches first (indices None: the
        matching rows of ``self.index[i]``), then each smaller or larger batch size."""
        if self.full[i] is not None:
            yield self.full[i], None
        yield from self.other[i]

    def walk(self, x: torch.Tensor, y: torch.Tensor, step, graph=None, replayed=None) -> None:
        """Every step in order, under autograd, the one walk of a training phase and of an ALA epoch: at
        step i the full batches run as ``graph``'s replay when there is one (then ``replayed(i)``), every
        other group as ``step(i, rows, x[idx], y[idx])``, ``x`` and ``y`` the concatenated samples."""
        with torch.enable_grad():
            for i in range(self.length):
                for rows, idx in self.steps(i):
                    if idx is None and graph is not None:
                        graph.replay(x[self.index[i]], y[self.index[i]], self.full_mask[i])
                        if replayed is not None:
                            replayed(i)
                        continue
                    idx = self.index[i, rows] if idx is None else idx
                    step(i, rows, x[idx], y[idx])


def rows_of(rows, n: int) -> list[int]:
    if isinstance(rows, slice):
        return list(range(*rows.indices(n)))
    return rows.tolist()


def concat_offsets(tensors: list[torch.Tensor]) -> list[int]:
    out, at = [], 0
    for t in tensors:
        out.append(at)
        at += len(t)
    return out


# ---- a training phase ----------------------------------------------------------------------------------------
class Objective(nn.Module):
    """The modules an objective reads, as one module whose forward is the objective: ``functional_call``
    on it swaps stacked entries into every one of those modules for the call."""

    def __init__(self, modules: dict[str, nn.Module], fn):
        super().__init__()
        for name, m in modules.items():  # entries named by dp_modules: "model.fc1.weight", "mixer.alpha"
            self.add_module(name, m)
        object.__setattr__(self, "fn", fn)

    def forward(self, x, y):
        return self.fn(x, y)


def objective_modules(client, objective) -> dict[str, nn.Module]:
    """The modules a phase's objective may read: the client's ``declares.dp_modules`` (the documented seam of
    the modules local training's optimizers step) and any module the objective's closure holds (a fine-tuned
    copy), each once."""
    found: dict[str, nn.Module] = {}
    seen: set[int] = set()
    fn = getattr(objective, "__func__", objective)
    closure = zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()), getattr(fn, "__closure__", None) or ())
    extra = {f"closure_{name}": cell.cell_contents for name, cell in closure
             if isinstance(cell.cell_contents, nn.Module)}
    for name, m in {**dp_modules(client), **extra}.items():
        if id(m) not in seen:
            seen.add(id(m))
            found[name] = m
    return found


def objective_identity(objective):
    """What must be equal for two clients' objectives to be one function of their own entries."""
    fn = getattr(objective, "__func__", None)
    return fn if fn is not None else getattr(objective, "__code__", objective)


@dataclasses.dataclass
class PhasePlan:
    """One client's phase, resolved: its objective as a module, the entries it trains (and their rates)."""
    client: object
    wrapper: Objective
    trained: dict[str, float]  # entry name -> learning rate
    batches: list
    key: tuple
    own: bool = True  # the client's own optimizer: ``after_backward`` (so ``declares.batch_step``) applies


def plan_phase(client, epochs: int, batch_size: int | None, optimizer, objective, generator):
    """The plan of one client's ``run_epochs`` phase, or a reason it cannot run stacked (a str)."""
    if type(optimizer) is not torch.optim.SGD:
        return f"its optimizer is {type(optimizer).__name__}, not plain SGD"
    for g in optimizer.param_groups:
        if g.get("momentum", 0) or g.get("weight_decay", 0) or g.get("nesterov") or g.get("maximize"):
            return "its SGD has momentum, weight decay, Nesterov or maximize"
    wrapper = Objective(objective_modules(client, objective), objective)
    names = {id(p): n for n, p in wrapper.named_parameters()}
    trained = {}
    for g in optimizer.param_groups:
        for p in g["params"]:
            if p.requires_grad:
                if id(p) not in names:
                    return "its optimizer trains a parameter outside its dp_modules"
                trained[names[id(p)]] = float(g["lr"])
    drawn = list(batches(client, epochs, batch_size, generator))
    bs = batch_size or client.cfg.batch_size
    state = tuple(client.declares.batch_state or ())
    key = ("train", type(client), objective_identity(objective), signature(wrapper), tuple(sorted(trained)), state,
           bs, tuple(client.x_train.shape[1:]), client.x_train.dtype)
    return PhasePlan(client, wrapper, trained, drawn, key)


def _with_state(obj, state: dict, fn):
    """``fn()`` with ``obj``'s attributes ``state`` temporarily replaced (a client's stacked per-client state
    seen by its loss under vmap)."""
    saved = {k: getattr(obj, k) for k in state}
    try:
        for k, v in state.items():
            setattr(obj, k, v)
        return fn()
    finally:
        for k, v in saved.items():
            setattr(obj, k, v)


class TrainPhase:
    """Several clients' phases of one ``key``, stacked: ``run()`` trains them and writes the trained
    entries back; returns each client's mean batch loss (or the Diverged error it raises)."""

    def __init__(self, plans: list[PhasePlan], graphs=None):
        self.plans, self.graphs = plans, graphs
        rep = plans[0]
        self.rep, self.client = rep.wrapper, rep.client
        self.names = list(rep.trained)
        clients = [p.client for p in plans]
        device = clients[0].x_train.device
        self.x = torch.cat([c.x_train for c in clients]) if len(clients) > 1 else clients[0].x_train
        self.y = torch.cat([c.y_train for c in clients]) if len(clients) > 1 else clients[0].y_train
        bs = rep.key[6]
        self.schedule = Schedule([p.batches for p in plans], concat_offsets([c.x_train for c in clients]), bs, device)
        order = [plans[c] for c in self.schedule.order]
        self.order = order
        entries = [dict(p.wrapper.named_parameters()) | dict(p.wrapper.named_buffers()) for p in order]
        self.train = {n: torch.stack([e[n].detach() for e in entries]) for n in self.names}
        self.const = {n: torch.stack([e[n].detach() for e in entries]) for n in entries[0] if n not in self.train}
        attrs = tuple(rep.client.declares.batch_state or ())
        self.state = {a: stack_tree([getattr(p.client, a) for p in order]) for a in attrs}
        self.lr = {n: torch.tensor([p.trained[n] for p in order], device=device,
                                   dtype=self.train[n].dtype).view(-1, *[1] * (self.train[n].dim() - 1))
                   for n in self.names}
        self.total = torch.zeros(len(order), device=device)
        self.vg = vmap(grad_and_value(self.loss), in_dims=(0, 0, dims_tree(self.state), 0, 0))
        # after_backward (so batch_step) applies to the client's own optimizer's phases only, as in run_epochs
        self.update = self.client.declares.batch_step if rep.own else sgd_step

    def loss(self, train, const, state, x, y):
        return _with_state(self.client, state, lambda: functional_call(self.rep, {**const, **train}, (x, y)))

    def step(self, i: int, rows, x, y) -> None:
        """Step ``i`` of the rows ``rows`` (their batches ``x``, ``y``)."""
        train = {n: t[rows] for n, t in self.train.items()}
        grads, loss = self.vg(train, select_tree(self.const, rows), select_tree(self.state, rows), x, y)
        new = self.update(train, grads, {n: lr[rows] for n, lr in self.lr.items()})
        for n in self.names:
            write_rows(self.train[n], rows, new[n])
        if isinstance(rows, slice):
            self.total[rows] += loss.detach()
        else:
            self.total.index_add_(0, rows, loss.detach())

    def masked_step(self, b: dict, x, y, mask) -> None:
        """The step a CUDA graph captures: every row of the stack, those not in ``mask`` left as they are."""
        grads, loss = self.vg(b["train"], b["const"], b["state"], x, y)
        new = self.update(b["train"], grads, b["lr"])
        for n, t in b["train"].items():
            t.copy_(torch.where(row_mask(mask, t), new[n], t))
        b["total"].add_(torch.where(mask, loss.detach(), torch.zeros_like(loss)))

    def use_graph(self):
        """With CUDA graphs: the graph of this phase's key, its buffers now this phase's stacked entries."""
        s = self.schedule
        if self.graphs is None or s.length == 0:
            return None
        buffers = {"train": self.train, "const": self.const, "state": self.state, "lr": self.lr, "total": self.total}
        graph = self.graphs.get((self.plans[0].key, s.n), buffers, self.masked_step, self.x[s.index[0]],
                                self.y[s.index[0]])
        if graph is not None:
            b = graph.buffers
            self.train, self.const, self.state, self.lr, self.total = b["train"], b["const"], b["state"], b["lr"], b["total"]
        return graph

    def run(self) -> list:
        s = self.schedule
        s.walk(self.x, self.y, self.step, self.use_graph())
        with torch.no_grad():
            for r, p in enumerate(self.order):
                params = dict(p.wrapper.named_parameters())
                for n in self.names:
                    params[n].copy_(self.train[n][r])
        totals = self.total.tolist()
        out = [None] * len(self.order)
        for r, p in enumerate(self.order):
            steps = max(s.count[r], 1)
            mean = totals[r] / steps
            if totals[r] != totals[r] or abs(totals[r]) == float("inf"):
                out[self.schedule.order[r]] = Diverged(
                    f"client {p.client.id}: training loss became {mean}; lower -lr (now "
                    f"{p.client.cfg.local_learning_rate}) or check the data")
            else:
                out[self.schedule.order[r]] = mean
        return out


# ---- evaluation ----------------------------------------------------------------------------------------------
def predict_many(models: list[nn.Module], xs: list[torch.Tensor], batch_size: int) -> list[torch.Tensor]:
    """Each model's logits on its own inputs (eval mode, no gradients): the models (one architecture)
    stacked, every client's samples in chunks of at most ``batch_size``; a client's last chunk is padded with
    its last sample (evaluation treats samples independently) and the padding dropped. The chunk is no
    longer than the median client's samples, so small clients are not padded to a large chunk."""
    order = sorted(range(len(models)), key=lambda c: -len(xs[c]))
    rep = models[order[0]]
    for m in models:
        m.eval()
    entries = [dict(models[c].named_parameters()) | dict(models[c].named_buffers()) for c in order]
    stacked = {n: torch.stack([e[n].detach() for e in entries]) for n in entries[0]}
    lengths = [len(xs[c]) for c in order]
    batch_size = max(1, min(batch_size, max(8, lengths[len(lengths) // 2])))
    flat = torch.cat([xs[c] for c in order])
    offsets = concat_offsets([xs[c] for c in order])
    device = flat.device
    fn = vmap(lambda p, xb: functional_call(rep, p, (xb,)))
    pieces: list[list[torch.Tensor]] = [[] for _ in order]
    span = torch.arange(batch_size, device=device)
    start = torch.tensor(offsets, device=device)
    last = torch.tensor([max(n - 1, 0) for n in lengths], device=device)
    with torch.no_grad():
        for j in range(0, max(lengths, default=0), batch_size):
            k = sum(1 for n in lengths if n > j)
            idx = start[:k, None] + torch.minimum(j + span, last[:k, None])
            logits = fn({n: t[:k] for n, t in stacked.items()}, flat[idx])
            for r in range(k):
                pieces[r].append(logits[r, :min(batch_size, lengths[r] - j)])
    out: list = [None] * len(models)
    for r, c in enumerate(order):
        if pieces[r]:
            out[c] = torch.cat(pieces[r])
        else:  # an empty input: its (0, classes) logits
            with torch.no_grad():
                out[c] = models[c](xs[c][:0])
    return out
