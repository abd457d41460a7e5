"""The batched engine (``--engine batched``): many clients' local SGD steps as one stacked computation,
optionally spread over single-thread worker processes (``--engine_workers``).

Why: with PFLlib's small local batches (``-lbs 10``) a client's step is a handful of tiny kernels. One at
a time they waste the CPU: per-call overhead, and with several OpenMP threads a barrier after every
kernel (on a busy machine a descheduled thread stalls the others). Here the round's participants train
together: their parameters are stacked (a leading client dimension on every tensor) and each step runs
``vmap(grad(loss))`` over the clients still training, which turns convolutions into grouped ones and
linear layers into batched matrix products. ``--engine_workers N`` splits the clients (balanced by
steps) over N forked processes with one thread each, which scale with the cores where threads do not.
Figures and the measurements behind the defaults: docs/performance.md.

Same numbers as the sequential path (within float tolerance; tests/test_engine.py): every client keeps
its own parameters and learning rate, and its batches come from its own stream exactly as
``Client.batches`` draws them (one ``randperm`` per epoch from ``batch_gen``, cut into ``-lbs`` slices,
the last one smaller). Only the float summation order inside the kernels differs.

Heterogeneous clients (Dir(0.1): 100 to 6,000 samples): clients are ordered by their number of steps, so
the ones still training at step s are always a prefix of the stack and each step works on views, with no
copies; a client's short last batch is a separate small group. A round takes as many stacked steps as
its largest client takes steps, the critical path of any schedule. ``--engine_stack K`` caps the
clients per stacked kernel (8 keeps the CNN's stacked weights and gradients in a CPU's cache).

On a CPU the default is ``--engine_stack 1``: no stacking, each client runs its own loop, in the worker
processes. Since the models run channels-last there (``--memory_format``), oneDNN's per-client batch-10
kernels beat the stacked grouped ones, which vmap runs in the default layout (measured in
docs/performance.md: 18.0 against 20.2 s per round). Stacking is for devices where a kernel launch costs
more than a small kernel's arithmetic (CUDA: default 0, no cap).

Which clients qualify (never inferred): a client class must declare ``batched_training = True`` in its
own body (a subclass does not inherit it), which says that its training is the base loop, plain SGD on
``loss`` = cross-entropy + the term ``batched_penalty()`` returns (FedProx's proximal term), with no
``after_backward``. Clients without it, runs with ``-dp``, and models with buffers (BatchNorm statistics)
or dropout train on the sequential path, in the same round (with workers: in the worker processes, one
by one, their whole state brought back, as a Ray executor would).

With workers, evaluation of clients evaluated by the base class, and ALA's local initialisation, run in
the worker processes too. Also here: ``autocast`` / ``make_scaler`` for ``--amp``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from utils.errors import FLError
from utils.forking import balance, fork_calls, fork_map, plain_evaluation


# ---- mixed precision (--amp) ------------------------------------------------------------------------
def amp_dtype(cfg) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(getattr(cfg, "amp", "off"))


def autocast(cfg, device: torch.device):
    """The ``--amp`` autocast context for forward passes (a no-op context with ``--amp off``)."""
    dtype = amp_dtype(cfg)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(cfg, device: torch.device):
    """A loss scaler for ``--amp fp16`` (fp16 gradients underflow without one); None otherwise."""
    if getattr(cfg, "amp", "off") != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


# ---- eligibility ---------------------------------------------------------------------------------
def declares_batched(cls: type) -> bool:
    """True when ``cls`` itself (not a parent) declares ``batched_training = True``."""
    return bool(vars(cls).get("batched_training", False))


def model_blocker(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained stacked (None when it can): buffers (BatchNorm statistics mix the
    samples of a batch and are updated in place) and dropout (its mask would come from the global RNG)."""
    if any(True for _ in model.buffers()):
        return "it has buffers (BatchNorm statistics)"
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return "it uses dropout"
    return None


# ---- the stacked training of one round -------------------------------------------------------------
def batch_sizes(n: int, epochs: int, bs: int) -> np.ndarray:
    """The size of each of a client's batches over ``epochs`` passes (as ``Client.batches`` cuts them)."""
    per_epoch = np.full(math.ceil(n / bs), bs, dtype=np.int64)
    per_epoch[-1] = n - bs * (len(per_epoch) - 1)
    return np.tile(per_epoch, epochs)


def schedule(ns: list[int], epochs: int, bs: int) -> tuple[np.ndarray, list]:
    """Stack order and step plan for clients with ``ns`` samples.

    Returns ``order`` (clients by decreasing step count, then decreasing last batch size) and, for each
    step, a list of ``(size, members)``: the stack positions training a batch of ``size`` at that step,
    as a ``slice`` when contiguous (always, for a single epoch) or an index array."""
    sizes = [batch_sizes(n, epochs, bs) for n in ns]
    order = sorted(range(len(ns)), key=lambda k: (-len(sizes[k]), -int(sizes[k][-1]), k))
    steps = len(sizes[order[0]]) if order else 0
    table = np.zeros((len(ns), steps), dtype=np.int64)
    for pos, k in enumerate(order):
        table[pos, :len(sizes[k])] = sizes[k]
    plan = []
    for s in range(steps):
        col = table[:, s]
        groups = []
        for size in sorted(set(col[col > 0].tolist()), reverse=True):
            pos = np.flatnonzero(col == size)
            contiguous = pos[-1] - pos[0] + 1 == len(pos)
            groups.append((size, slice(int(pos[0]), int(pos[-1]) + 1) if contiguous else pos))
        plan.append(groups)
    return np.asarray(order, dtype=np.int64), plan


def _chunks(members, cap: int):
    if cap <= 0:
        yield members
    elif isinstance(members, slice):
        for a in range(members.start, members.stop, cap):
            yield slice(a, min(a + cap, members.stop))
    else:
        for a in range(0, len(members), cap):
            yield members[a:a + cap]


@dataclasses.dataclass
class StackJob:
    """One stack of clients' training for one round, self-contained so it runs here or in a worker.

    ``params``: name -> (K, ...) stacked parameters, updated in place; ``xs`` / ``ys``: the clients'
    training tensors; ``index``: (K, steps, bs) indices into their concatenation, one batch per row;
    ``plan``: ``schedule``'s step plan; ``penalty`` / ``aux``: the declared extra term and its stacked
    per-client tensors."""
    template: nn.Module
    params: dict
    xs: list
    ys: list
    index: torch.Tensor
    plan: list
    lrs: list
    penalty: object = None
    aux: object = None
    max_stack: int = 0
    amp: str = "off"


def prepare(clients: list, round_idx: int, cfg, max_stack: int) -> tuple[list, StackJob]:
    """(clients in stack order, their job). Draws every client's batches from its own stream now,
    exactly as ``Client.batches`` would during training."""
    epochs, bs = cfg.local_epochs, cfg.batch_size
    order, plan = schedule([c.train_samples for c in clients], epochs, bs)
    stack = [clients[k] for k in order]
    offsets = np.cumsum([0] + [c.train_samples for c in stack])
    index = torch.zeros((len(stack), len(plan), bs), dtype=torch.long)
    for pos, c in enumerate(stack):
        per_epoch = math.ceil(c.train_samples / bs)
        rows = index[pos].view(-1)
        for e in range(epochs):  # each epoch starts a new batch row; its last row may be partly empty
            perm = torch.randperm(c.train_samples, generator=c.batch_gen) + int(offsets[pos])
            rows[e * per_epoch * bs:e * per_epoch * bs + c.train_samples] = perm
    named = [dict(c.model.named_parameters()) for c in stack]
    # Contiguous whatever the models' layout (--memory_format): stacked channels-last weights send vmap's
    # grouped convolutions and max pooling down kernels that break ties between equal activations (common
    # on blank image regions) differently from the sequential path, and so route gradients elsewhere.
    params = {n: torch.stack([m[n].detach() for m in named]).contiguous() for n in named[0]}
    penalty, aux = None, None
    if stack[0].batched_penalty() is not None:
        penalty = stack[0].batched_penalty()[0]
        aux = torch.utils._pytree.tree_map(lambda *ts: torch.stack(ts),
                                           *[c.batched_penalty()[1] for c in stack])
    job = StackJob(stack[0].model, params, [c.x_train for c in stack], [c.y_train for c in stack],
                   index.to(stack[0].device), plan, [c.learning_rate(round_idx) for c in stack], penalty, aux,
                   max_stack, getattr(cfg, "amp", "off"))
    return stack, job


def run_job(job: StackJob) -> torch.Tensor:
    """Every step of ``job`` (updating ``job.params`` in place); returns each client's summed batch loss."""
    x_all, y_all = torch.cat(job.xs), torch.cat(job.ys)
    template, penalty = job.template, job.penalty
    amp_dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(job.amp)

    def client_loss(p, x, y, a):
        with torch.autocast(x.device.type, dtype=amp_dt or torch.bfloat16, enabled=amp_dt is not None):
            logits = functional_call(template, p, (x,))
        loss = nn.functional.cross_entropy(logits.float(), y)
        return loss if penalty is None else loss + penalty(p, a)

    step = vmap(grad_and_value(client_loss), in_dims=(0, 0, 0, None if job.aux is None else 0))
    lrs = job.lrs
    lr = lrs[0] if all(v == lrs[0] for v in lrs) else torch.tensor(lrs, device=x_all.device)
    loss_sum = torch.zeros(len(lrs), device=x_all.device)
    template.train()
    for s, groups in enumerate(job.plan):
        for size, members in groups:
            for m in _chunks(members, job.max_stack):
                _step(step, job.params, job.aux, job.index, x_all, y_all, s, size, m, lr, loss_sum)
    return loss_sum


def finish(stack: list, job: StackJob, loss_sum: torch.Tensor, cfg, elapsed: float) -> None:
    """Write the trained parameters back into the clients and do the rest of ``Client.train``: train
    mode, the optimizer's learning rate, the non-finite loss check and one ``train_time`` entry each
    (``len(train_time)`` counts the rounds a client trained; the time is the stack's, shared by steps)."""
    with torch.no_grad():
        for pos, c in enumerate(stack):
            c.model.train()
            for n, p in c.model.named_parameters():
                p.copy_(job.params[n][pos])
            for group in c.optimizer.param_groups:
                group["lr"] = job.lrs[pos]
    bad = torch.nonzero(~torch.isfinite(loss_sum)).flatten().tolist()
    if bad:
        c = stack[bad[0]]
        raise FLError(f"client {c.id}: training loss became {float(loss_sum[bad[0]])}; lower -lr (now "
                      f"{cfg.local_learning_rate}) or check the data")
    steps = [len(batch_sizes(c.train_samples, cfg.local_epochs, cfg.batch_size)) for c in stack]
    for c, k in zip(stack, steps):
        c.train_time.append(elapsed * k / max(sum(steps), 1))


def train_stacked(clients: list, round_idx: int, cfg, max_stack: int = 0) -> None:
    """What ``c.train(round_idx)`` does, for every client of ``clients`` (one class, one architecture),
    in this process: same batches, same SGD updates."""
    start = time.perf_counter()
    stack, job = prepare(clients, round_idx, cfg, max_stack)
    loss_sum = run_job(job)
    finish(stack, job, loss_sum, cfg, time.perf_counter() - start)


def _step(step, params, aux, index, x_all, y_all, s, size, members, lr, loss_sum) -> None:
    """One SGD step of the clients at stack positions ``members`` on their ``size``-sample batch ``s``."""
    idx = index[members, s, :size]
    x, y = x_all[idx], y_all[idx]
    if isinstance(members, slice):
        p = {n: t[members] for n, t in params.items()}  # views: the update below lands in ``params``
    else:
        members = torch.as_tensor(members, device=x.device)
        p = {n: t.index_select(0, members) for n, t in params.items()}
    a = None if aux is None else torch.utils._pytree.tree_map(lambda t: t[members], aux)
    grads, losses = step(p, x, y, a)
    with torch.no_grad():
        if isinstance(lr, float):
            torch._foreach_add_(list(p.values()), list(grads.values()), alpha=-lr)
        else:
            r = lr[members]
            for n in p:
                p[n].sub_(grads[n] * r.view(-1, *[1] * (grads[n].dim() - 1)))
        if not isinstance(members, slice):
            for n, t in params.items():
                t.index_copy_(0, members, p[n])
        loss_sum[members] += losses.detach().float()


class BatchedEngine:
    """Trains the eligible clients of a round together; ``train`` returns the others, which the caller
    trains one by one. ``max_stack`` caps how many clients share one stacked step (0: no cap);
    ``workers`` > 0 splits the round's clients over that many single-thread processes."""

    def __init__(self, cfg, max_stack: int = 0, workers: int = 0):
        self.cfg, self.max_stack, self.workers = cfg, max_stack, workers
        self._notes: set[str] = set()

    def _note(self, msg: str) -> None:
        if msg not in self._notes:
            self._notes.add(msg)
            print(f"note: {msg}")

    def split(self, clients: list) -> tuple[list, list]:
        """(clients trained here, clients left to the sequential path)."""
        if self.cfg.privacy:
            self._note("--engine batched: -dp clients train one by one (per-sample clipping)")
            return [], list(clients)
        batched, rest = [], []
        for c in clients:
            if not declares_batched(type(c)):
                self._note(f"--engine batched: {type(c).__name__} does not declare batched_training; it "
                           f"trains on the sequential path")
                rest.append(c)
                continue
            why = model_blocker(c.model)
            if why is not None:
                self._note(f"--engine batched: the model cannot be stacked ({why}); clients train one by one")
                rest.append(c)
                continue
            batched.append(c)
        return batched, rest

    def train(self, clients: list, round_idx: int) -> list:
        """Train the eligible ``clients`` for round ``round_idx``; returns the ones not trained here.
        Stacks of one (``--engine_stack 1``) are each client's own training loop: in the worker
        processes, one client after the other, or (no workers) left to the caller."""
        batched, rest = self.split(clients) if self.max_stack != 1 else ([], list(clients))
        groups: dict[type, list] = {}
        for c in batched:
            groups.setdefault(type(c), []).append(c)
        for group in groups.values():
            if self.workers > 0 and len(group) > 1:
                self._train_in_workers(group, round_idx)
            else:
                train_stacked(group, round_idx, self.cfg, self.max_stack)
        if self.workers > 0 and len(rest) > 1 and not any(c.checkpoint_skip for c in rest):
            fork_calls("train", [(c, (round_idx,)) for c in rest], self.workers)  # one by one, in parallel
            return []
        return rest

    def receive(self, calls: list, executor) -> None:
        """The ``receive_global`` calls of a broadcast: those that run ALA (the costly local
        initialisation: a forward pass over the s % sample, then W's training) in the worker processes,
        the others through ``executor``."""
        heavy = [k for k, (c, (_, participating)) in enumerate(calls)
                 if participating and c.ala is not None and c.train_time]
        if len(heavy) < 2 or any(calls[k][0].checkpoint_skip for k in heavy):  # (skipped state would be lost)
            heavy = []
        fork_calls("receive_global", [calls[k] for k in heavy], self.workers)
        forked = set(heavy)
        executor.call_each("receive_global", [call for k, call in enumerate(calls) if k not in forked])

    def _train_in_workers(self, clients: list, round_idx: int) -> None:
        start = time.perf_counter()
        steps = [len(batch_sizes(c.train_samples, self.cfg.local_epochs, self.cfg.batch_size)) for c in clients]
        parts = [prepare([clients[k] for k in g], round_idx, self.cfg, self.max_stack)
                 for g in balance(steps, self.workers)]
        for _, job in parts:
            for t in job.params.values():
                t.share_memory_()  # the children's in-place updates land here
        losses = [torch.tensor(v) for v in fork_map(lambda job: run_job(job).tolist(), [job for _, job in parts])]
        elapsed = time.perf_counter() - start
        for (stack, job), loss in zip(parts, losses):
            finish(stack, job, loss, self.cfg, elapsed)

    def evaluate(self, clients: list, train_loss: bool, executor) -> tuple[list, list | None]:
        """``(test_metrics, train_metrics)`` of every client, the plain ones split over the worker
        processes (balanced by samples), the others through ``executor``."""
        import sklearn.metrics  # noqa: F401 -- the AUC's import, done once here rather than in every child

        plain = [c for c in clients if plain_evaluation(c)]
        if train_loss and self.cfg.train_loss_eval == "sampled":
            for c in plain:
                c.train_loss_sample()  # drawn here, so it is drawn once
        sizes = [c.test_samples + (c.train_samples if train_loss else 0) for c in plain]
        groups = [[plain[k] for k in g] for g in balance(sizes, self.workers)]
        done = {}
        for group, res in zip(groups, fork_map(
                lambda g: [(c.test_metrics(), c.train_metrics() if train_loss else None) for c in g], groups)):
            done.update({c.id: r for c, r in zip(group, res)})
        others = [c for c in clients if c.id not in done]
        tests = dict(zip([c.id for c in others], executor.map(others, "test_metrics")))
        trains = dict(zip([c.id for c in others], executor.map(others, "train_metrics"))) if train_loss else {}
        for c in others:
            done[c.id] = (tests[c.id], trains.get(c.id))
        return [done[c.id][0] for c in clients], [done[c.id][1] for c in clients] if train_loss else None


def make_engine(cfg) -> BatchedEngine | None:
    """The engine named by ``--engine`` (None for ``sequential``)."""
    if getattr(cfg, "engine", "sequential") != "batched":
        return None
    stack = getattr(cfg, "engine_stack", None)
    if stack is None:  # measured (docs/performance.md): per-client channels-last loops win on a CPU
        stack = 1 if torch.device(cfg.device).type == "cpu" else 0
    return BatchedEngine(cfg, stack, getattr(cfg, "engine_workers", 0))
