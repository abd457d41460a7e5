"""``--executor batched``: the round's clients train (and are evaluated) as one stacked computation.

The clients are ordinary objects in this process, as with the sequential executor, and every server call
still runs each client's own method (``train``, ``receive``, ``test_metrics``, ...), so an algorithm's
Python code is unchanged. What changes is who computes: each client's method runs in a thread of its own,
one thread at a time, and when it reaches one of the three computations this executor batches (a
``run_epochs`` phase, a ``predict``, an ALA weight epoch: the seam in utils/batching.py) it hands the work
over and waits. Once every client of the call has handed over its work or finished, the work is grouped
(same kind, same architecture, same objective: runtime/stacked.py) and each group runs as one stacked
computation; then each client resumes, in order, until its next hand-over. Multi-phase algorithms thus
batch each phase: FedRep's head epochs then body epochs, Ditto's two models, FedBABU's fine-tuning at
evaluation; an ALA start phase whose clients converge after different numbers of epochs batches each epoch
with the clients still at it.

Which algorithms batch is each client class's declaration ``batch_state`` (clientbase.py): None (the
default) refuses, with one line naming the hooks the class overrides (``batch_refusal``); a tuple opts in
and names the per-client attributes its loss reads besides its modules. The flags it cannot honour are
refused the same way: ``-dp`` (DP-SGD's per-sample clipping), ``--amp``, and models with BatchNorm or
dropout (running statistics updated in place, random draws from the global generator: neither has a
per-client form under vmap). A phase the stacked step cannot express (an optimizer other than plain SGD)
runs client by client, with the same numbers. ``--batch_clients K`` stacks at most K clients at a time
(memory), and on CUDA the full-size step is captured as a CUDA graph (``--cuda_graphs``).
"""
from __future__ import annotations

import threading

from runtime.executors import SequentialExecutor
from runtime.graphs import CudaGraphs
from runtime.stacked import TrainPhase, plan_phase, predict_many, signature
from runtime.stacked_ala import ALAEpoch, ala_key
from utils.batching import set_session
from utils.errors import FLError
from utils.declares import declared_by

# The client hooks and declaration fields that shape local training: a class that declares ``batch_state``
# vouches for these as they are at its level; a subclass that overrides or redeclares one has not
# (``batch_refusal``).
TRAINING_HOOKS = ("loss", "after_backward", "local_update", "run_epochs", "make_optimizer")
TRAINING_FIELDS = ("batch_step", "dp_modules")


def _root(cls: type) -> type:
    """The client base class: the first to declare ``batch_state`` (runtime/ never imports flcore/)."""
    return [k for k in cls.__mro__ if declared_by(k, "batch_state") is k][-1]


def changed_below(cls: type, top: type) -> list[str]:
    """The training hooks that ``cls`` or a base below ``top`` defines, then the training fields one of them
    declares."""
    below = cls.__mro__[:cls.__mro__.index(top)]
    return ([h for h in TRAINING_HOOKS if any(h in vars(k) for k in below)]
            + [f for f in TRAINING_FIELDS if declared_by(cls, f) in below])


def overridden(cls: type) -> list[str]:
    """The training hooks and fields that ``cls`` or a base below the client base class changes."""
    return changed_below(cls, _root(cls))


def batch_refusal(cls: type) -> str:
    """Why clients of ``cls`` cannot train batched; "" when they can (``declares.batch_state`` set at a class
    whose training hooks no subclass changes, and ``after_backward`` matched by a ``declares.batch_step``)."""
    owner = declared_by(cls, "batch_state")
    if cls.declares.batch_state is None:
        hooks = overridden(cls)
        return ("its local update is not declared batchable (batch_state)"
                + (f"; it overrides {', '.join(hooks)}" if hooks else ""))
    below = changed_below(cls, owner)
    if below:
        return f"{cls.__name__} overrides {', '.join(below)} below {owner.__name__}, which declared batch_state"
    root = _root(cls)
    after = next((k for k in cls.__mro__ if "after_backward" in vars(k)), root)
    step = declared_by(cls, "batch_step") or root
    if after is not root and not issubclass(step, after):
        return f"{after.__name__}.after_backward has no batch_step"
    return ""


def model_refusal(model) -> str:
    """Why a model cannot be stacked over clients; "" when it can."""
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"the model has {type(m).__name__} layers, whose running statistics change in place"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return (f"the model has {type(m).__name__} layers, whose masks vmap draws from the global "
                    f"generator, not from each client's stream")
    return ""


def config_refusal(cfg) -> str:
    """Why these flags cannot run batched; "" when they can."""
    if cfg.privacy and cfg.dp_level == "sample":
        return "-dp's DP-SGD clips and noises per-sample gradients (use --dp_level client, or another executor)"
    if cfg.amp != "off":
        return "--amp is not supported by the stacked step (run it fp32)"
    return ""


TABLE_HEADER = "| algorithm | `--executor batched` |\n"


def batch_table(client_classes: dict[str, type]) -> str:
    """docs/performance.md's table, made from the declarations: each algorithm (name -> client class) and
    whether its clients train batched, or why not."""
    rows = [TABLE_HEADER, "|---|---|\n"]
    for name, cls in client_classes.items():
        why = batch_refusal(cls)
        rows.append(f"| {name} | {'yes' if not why else 'no: ' + why} |\n")
    return "".join(rows)


class BatchedExecutor(SequentialExecutor):
    """Clients in this process; each call's computations stacked across clients (module docstring)."""
    name = "batched"

    def __init__(self, cfg, parking=None, auto: bool = False):
        super().__init__(parking)
        self.cfg, self.auto = cfg, auto
        self.plain = False  # --executor auto and a model that cannot be stacked: the sequential loop
        self.max_group = cfg.batch_clients or None
        graphs = cfg.cuda_graphs and str(cfg.device).startswith("cuda")
        self.graphs = CudaGraphs() if graphs else None

    def start(self, factory, datas: list) -> list:
        models = [factory.model, *({id(m): m for m in factory.own.values()}.values() if factory.own else ())]
        why = (batch_refusal(factory.client_class) or config_refusal(self.cfg)
               or next((r for r in map(model_refusal, models) if r), ""))
        if why and self.auto:
            print(f"note: --executor auto: the sequential loop on {self.cfg.device}, as {why}")
            self.plain = True
        elif why:
            raise FLError(f"--executor batched: {self.cfg.algorithm} cannot train batched: {why}; use --executor "
                          f"sequential (or auto)")
        return super().start(factory, datas)

    def map(self, clients, method: str, *args, **kwargs) -> list:
        if self.plain:
            return super().map(clients, method, *args, **kwargs)
        return Session(self).run([(c.id, method, args, kwargs) for c in clients])

    def call_each(self, method: str, calls) -> list:
        if self.plain:
            return super().call_each(method, calls)
        return Session(self).run([(c.id, method, args, {}) for c, args in calls])


class _Abort(BaseException):
    """Raised inside a client's thread to unwind it when the call is abandoned (another client failed)."""


class _Slot:
    """One client's thread in a session: what it handed over, what it gets back, and how it ended."""

    def __init__(self):
        self.go = threading.Semaphore(0)
        self.request = None
        self.result = None
        self.value = None
        self.error: BaseException | None = None
        self.done = False
        self.abort = False


class _View:
    """What a client's thread sees as its session (utils.batching.session()): each computation is handed
    to the coordinator, and the thread waits for its result."""

    def __init__(self, session: "Session", slot: _Slot):
        self.session, self.slot = session, slot

    def _hand_over(self, request):
        slot = self.slot
        slot.request, slot.result = request, None
        self.session.back.release()
        slot.go.acquire()
        if slot.abort:
            raise _Abort()
        result, slot.request = slot.result, None
        if isinstance(result, BaseException):
            raise result
        return result

    def run_epochs(self, client, epochs, batch_size, optimizer, objective, generator) -> float:
        return self._hand_over(("train", client, epochs, batch_size, optimizer, objective, generator))

    def predict(self, model, x, batch_size):
        return self._hand_over(("predict", model, x, batch_size))

    def ala_epoch(self, ala, forward, local_top, glob_top, inputs, ys, merge):
        return self._hand_over(("ala", ala, forward, local_top, glob_top, inputs, ys, merge))


class Session:
    """One executor call: a thread per client, run one at a time, and the stacked work between them."""

    def __init__(self, executor: BatchedExecutor):
        self.executor = executor
        self.back = threading.Semaphore(0)

    def _body(self, slot: _Slot, call) -> None:
        slot.go.acquire()
        set_session(_View(self, slot))
        try:
            if not slot.abort:
                cid, method, args, kwargs = call
                slot.value = self.executor.host.run(cid, method, args, kwargs)
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread, raised there)
            slot.error = e
        finally:
            set_session(None)
            slot.done = True
            self.back.release()

    def run(self, calls: list) -> list:
        slots = [_Slot() for _ in calls]
        threads = [threading.Thread(target=self._body, args=(s, c), daemon=True) for s, c in zip(slots, calls)]
        for t in threads:
            t.start()
        pending = list(range(len(calls)))
        try:
            while pending:
                for i in pending:  # one thread at a time, in call order: each runs to a hand-over or its end
                    slots[i].go.release()
                    self.back.acquire()
                failed = next((slots[i].error for i in pending if slots[i].error is not None), None)
                if failed is not None:
                    raise failed
                pending = [i for i in pending if not slots[i].done]
                if pending:
                    self.compute([slots[i] for i in pending])
        finally:
            for s in slots:
                if not s.done:
                    s.abort = True
                    s.go.release()
                    self.back.acquire()
            for t in threads:
                t.join()
        return [s.value for s in slots]

    # ---- the stacked work ----------------------------------------------------------------------------
    def compute(self, slots: list[_Slot]) -> None:
        """Every waiting thread's request answered: grouped by kind and key, each group stacked."""
        groups: dict = {}
        for s in slots:
            kind = s.request[0]
            if kind == "train":
                _, client, epochs, bs, optimizer, objective, generator = s.request
                own = optimizer is None
                opt = client.optimizer if own else optimizer
                plan = plan_phase(client, epochs, bs, opt, client.loss if objective is None else objective, generator)
                if isinstance(plan, str):  # not expressible stacked: this client's phase runs on its own
                    s.result = self._alone(client, epochs, bs, optimizer, objective, generator)
                    continue
                if not own:  # after_backward corrects the client's own model only (run_epochs' rule)
                    plan.key, plan.own = (*plan.key, "other"), False
                groups.setdefault(plan.key, []).append((s, plan))
            elif kind == "predict":
                _, model, x, bs = s.request
                groups.setdefault(("predict", signature(model), tuple(x.shape[1:]), x.dtype, bs), []).append((s, None))
            else:
                groups.setdefault(ala_key(s.request[1:]), []).append((s, None))
        for key, members in groups.items():
            step = self.executor.max_group or len(members)
            for i in range(0, len(members), step):
                self._run_group(key[0], members[i:i + step])

    def _run_group(self, kind: str, members: list) -> None:
        if kind == "train":
            out = TrainPhase([p for _, p in members], self.executor.graphs).run()
        elif kind == "predict":
            out = predict_many([s.request[1] for s, _ in members], [s.request[2] for s, _ in members],
                               members[0][0].request[3])
        else:
            out = ALAEpoch([s.request[1:] for s, _ in members], self.executor.graphs).run()
        for (s, _), r in zip(members, out):
            s.result = r

    @staticmethod
    def _alone(client, epochs, bs, optimizer, objective, generator):
        try:  # this (the caller's) thread has no session: the sequential loop
            return client.run_epochs(epochs, bs, optimizer=optimizer, objective=objective, generator=generator)
        except Exception as e:  # noqa: BLE001  (raised in the client's thread)
            return e
