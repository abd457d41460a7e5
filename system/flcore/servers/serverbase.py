"""Server: what an algorithm says about its server side: its flags, its model, who takes part, what each
client receives, what the uploads become, and its own figures. The engine (runtime/loop.py) runs the rounds
and calls these hooks; an algorithm never copies the loop.

Round t, ``runtime.loop.run_round(server, t)``:
    select_clients -> prepare_broadcast, broadcast(client) for every client (its ``receive(payload,
    participating)`` runs local initialisation, e.g. ALA) -> evaluation every ``-eg`` rounds -> local
    training -> each active client's ``upload()`` (an ``Upload``) -> aggregate -> after_round.
The cross-cutting features (attacks, robust aggregation, server optimizers, DP, the DLG monitor: plugins/)
act at the round's named points; the algorithms need not know. What an algorithm cannot take, it declares
(``declares``: ``dp_support``, ``averaging_refusal``, ``robust_refusal``, ...): refused at start-up with one
line.

A new algorithm subclasses ``Server`` (``declares = Declares(client_class=..., ...)``, utils/declares.py)
and overrides only the hooks it changes (README's hooks table is the whole surface). Who does what else:
    the rounds, evaluation, -nnc's new clients, closing   runtime/loop.py (train, run_round, evaluate, ...)
    checkpoints: the server's state and its restore      runtime/checkpoint.py (server_state, load_server_state)
    the initial model(s) and the client factory          flcore/building.py
    where clients live                                   runtime/executors.py
A subclass that still defines one of those (an engine method this class used to carry) stops at import
with one line naming the new place (``MOVED``).

Clients live where the executor puts them: in this process, in forked worker processes (the CPU default)
or in Ray workers, where ``self.clients`` holds ``ClientHandle`` proxies (as it does with parking). A server
therefore talks to its clients through method calls only (``self.call_clients(clients, "m", *args)``,
``self.call_each("m", [(c, args), ...])``, or ``c.m(...)`` for one client); reading an attribute gives a
copy, and writing one is refused.
"""
from __future__ import annotations

import copy

import torch

from flcore.clients.clientbase import Client, Upload
from flcore import building
from flcore.trainmodel.assign import assign, read_client_models
from runtime import checkpoint
from runtime.choose import make_executor
from runtime.faults import SlowClients
from runtime.loop import PhaseTimer
from plugins import build_all
from utils.aggregate import weighted_average
from utils.data_utils import FederatedData
from utils.entries import SealedUpload
from utils.declares import Declares, moved_to_declares, settle
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.model_support import ModelSupport
from utils.results import RunRecorder
from utils.seeding import np_rng
from utils.selection import select

# What a Server subclass may no longer define, and where that responsibility lives now (one line each).
MOVED = {
    "train": "the loop is runtime.loop.train(server); end-of-round work goes in after_round",
    "run_round": "a round is runtime.loop.run_round(server, t); change it through the hooks (broadcast, "
                 "aggregate, after_round, ...)",
    "evaluate": "evaluation is runtime.loop.evaluate(server); an algorithm's own figures go in extra_metrics",
    "evaluate_new_clients": "-nnc's evaluation is runtime.loop.evaluate_new_clients(server); a new client's "
                            "payload is new_client_payload",
    "close": "runtime.loop.close(server) releases the executor",
    "state_dict": "a server's state is runtime.checkpoint.server_state(server); leave attributes out with "
                  "checkpoint_skip",
    "load_state_dict": "runtime.checkpoint.load_server_state(server, saved) restores a server",
    "checkpoint_links": "runtime.checkpoint.server_links(server)",
    "checkpoint_fixed": "runtime.checkpoint.SERVER_FIXED",
    "checkpoint_built": "runtime.checkpoint.SERVER_BUILT",
    "new_module": "a server module made after construction is restored as a copy of the global model "
                  "(runtime.checkpoint.load_server_state)",
    "initial_model": "flcore.building.initial_model(server), built through build_model",
    "client_models": "flcore.building.client_models(server), built through build_model",
    "client_factory": "flcore.building.client_factory(server); construction-time logic belongs in the "
                      "client's __init__",
    "pfllib_flag_defaults": "flcore.registry.pfllib_flag_defaults(cls) reads pfllib_defaults",
    "_send_models": "runtime.loop.send(server, participants); what goes down is broadcast / prepare_broadcast",
    "_train_clients": "runtime.loop.train_clients(server, clients); local training is the client's local_update",
    "_receive_models": "runtime.loop.receive(server, clients); what goes up is the client's upload",
    "_aggregate": "runtime.loop.aggregate(server, uploads) wraps the aggregate hook",
    "_record": "runtime.loop.record(server, summary)",
}


class Server:
    # What the algorithm is, what it shares and which options it cannot take (utils/declares.py documents
    # every field); a subclass names only the fields it changes.
    declares = Declares(
        client_class=Client,
        personalized=True,
        dp_support=DPSupport(),
        model_support=ModelSupport(),
        averaging_refusal="",
        robust_refusal="",
        new_client_refusal="",
        slr_default=None,
        pfllib_defaults={},
        checkpoint_skip=(),
    )

    def __init_subclass__(cls, **kwargs):
        """Settle the subclass's ``declares`` (utils/declares.py). A subclass written for the members this class
        used to carry (an engine method, ``MOVED``, defined or read as ``self.<name>``; a declaration
        attribute, now a field of ``declares``) stops here, at import, with one line naming where that
        responsibility lives now."""
        super().__init_subclass__(**kwargs)
        moved = {k: f"no longer a Server member; {v}" for k, v in MOVED.items()}
        settle(cls, Declares, {**moved_to_declares(Declares), **moved}, moved)

    @classmethod
    def add_args(cls, parser) -> None:
        """Add this algorithm's own flags to ``parser`` (defaults from its paper)."""

    @classmethod
    def check_config(cls, cfg) -> None:
        """Reject flag combinations this algorithm cannot honour (raise FLError with one clear line)."""


    def __init__(self, cfg, data: FederatedData, run: int = 0, recorder: RunRecorder | None = None,
                 executor=None):
        cfg = cfg.replace(num_clients=len(data.clients))  # -nc cut the split already; None meant all
        self.cfg, self.data, self.run = cfg, data, run
        self.device = torch.device(cfg.device)
        # --client_models: each client's architecture, trained clients then new ones (-nnc); None without it
        self.client_model_names = None if cfg.client_models is None else assign(
            read_client_models(cfg.client_models), len(data.clients) + len(data.new_clients))
        self.global_model = building.initial_model(self)
        self.executor = executor if executor is not None else make_executor(cfg, self.declares.client_class)
        self.clients = self.executor.start(building.client_factory(self), data.clients)
        # -nnc: how the clients held out of training are built after it, from the common initial model
        self.new_clients = (building.client_factory(self, copy.deepcopy(self.global_model)) if data.new_clients
                            else None)
        # Independent streams: an algorithm's own draws never change who is selected or dropped.
        self.select_rng = np_rng(cfg.seed, run, "select")
        self.drop_rng = np_rng(cfg.seed, run, "drop")
        # -tsr: each client's own step count (one call to every client, so only when someone is slow)
        steps = ([0] * len(self.clients) if cfg.train_slow_rate == 0
                 else self.call_clients(self.clients, "steps_per_round"))
        self.slow = SlowClients(cfg, run, steps)
        self.late: list[int] = []  # clients whose upload missed the last round (-tth)
        self.recorder = recorder
        self.checkpoints = checkpoint.Checkpoints(recorder)  # the run's file and restart point
        self.timer = PhaseTimer()  # the loop's timing seam: none by default (scripts/run/benchmark.py sets one)
        # the cross-cutting features the flags turn on (plugins/), called at the round's points; their state
        # is part of the checkpointed state
        self.plugins = build_all(cfg, self)
        self.averaged = False  # whether this round's aggregate went through average_uploads
        self.selected: list[Client] = []
        self.round_idx = 0
        self.bytes_down = self.bytes_up = 0  # of the current round: what its broadcast and uploads moved

    def build_model(self, name: str | None = None) -> torch.nn.Module:
        """The model ``-m``; with ``--client_models`` the architecture ``name`` (default ``-m``), its
        classifier taking ``-fd`` features (``models.build_client_model``). An algorithm that reshapes its
        model (a head/body split) overrides this, so every client's architecture is reshaped alike."""
        return building.model_of(self, name)

    # ---- calling clients ---------------------------------------------------------------------------
    def call_clients(self, clients: list[Client], method: str, *args) -> list:
        """``c.method(*args)`` for each of ``clients``, wherever the executor holds them (one after the
        other, or in parallel in workers); the results in order. How a server asks its clients anything
        (APFL's mixing weights, FedDBE's initial means). ``method`` may also be a module-level function,
        run as ``method(c, *args)`` where the client lives (the engine's steps: runtime/client_steps.py)."""
        return self.executor.map(clients, method, *args)

    def call_each(self, method: str, calls: list[tuple[Client, tuple]]) -> list:
        """``c.method(*args)`` for each ``(c, args)`` of ``calls``: ``call_clients`` with per-client
        arguments (FedFomo's neighbour requests)."""
        return self.executor.call_each(method, calls)

    # ---- hooks -------------------------------------------------------------------------------------
    def select_clients(self) -> list[Client]:
        """``-jr`` of the clients, drawn without replacement from the selection stream; with ``-rjr`` the
        count itself is drawn uniformly from [jr*N, N] each round (utils/selection.py)."""
        return [self.clients[i] for i in select(self.cfg, len(self.clients), self.select_rng)]

    def prepare_broadcast(self, participants: list[Client]) -> None:
        """Called once per broadcast, before ``broadcast``: work shared by every client's payload (FedAMP's
        attention weights) or questions to the participants (FedFomo's neighbour requests)."""

    def broadcast(self, client: Client):
        """What ``client`` receives this round (its ``receive(payload, participating)``): by default the
        global model. Return None to send it nothing. A payload object shared by several clients is
        serialised once per worker."""
        return self.global_model

    def aggregate(self, uploads: list[Upload]) -> None:
        """Sample-weighted FedAvg over every floating state entry (BatchNorm statistics included unless
        ``--bn_stats local``), through ``average_uploads``."""
        if uploads:
            self.average_uploads(uploads)

    def average_uploads(self, uploads: list[Upload], target: torch.nn.Module | None = None,
                        prefix: str = "") -> None:
        """The one path by which a server averages uploaded model entries into one of its models (``target``,
        by default the global model): the uploads' entries whose names start with ``prefix`` (taken off to
        name ``target``'s entries) are combined by the plug-ins' ``combine`` (``--aggregator``,
        plugins/robust.py; the sample-weighted mean by default), stepped by their ``step`` (``--server_opt``,
        plugins/server_opt.py: parameters only, BatchNorm statistics take the aggregate) and loaded by
        ``load_aggregate``; ``target``'s other entries keep their values. A split model's shared part: the
        uploads name global entries; FedRep's body: ``target=self.global_model.base``."""
        uploads = [u.opened() if isinstance(u, SealedUpload) else u for u in uploads]
        keys = [k for k in uploads[0].state if k.startswith(prefix)]
        current = target.state_dict() if target is not None else self.global_model.state_dict()
        target = self.global_model if target is None else target
        reference = {k: current[k[len(prefix):]] for k in keys if k[len(prefix):] in current}
        reference = reference if len(reference) == len(keys) else None
        agg = next((a for a in (p.combine(self, uploads, keys, reference, target, prefix) for p in self.plugins)
                    if a is not None), None)
        if agg is None:
            agg = weighted_average([u.state for u in uploads], [u.weight for u in uploads], keys)
        agg = {k[len(prefix):]: v for k, v in agg.items()}
        params = [k for k, _ in target.named_parameters() if k in agg]
        for p in self.plugins:
            agg = p.step(self, current, agg, params)
        self.load_aggregate(target, {**current, **agg})
        self.averaged = True

    def load_aggregate(self, target: torch.nn.Module, state: dict) -> None:
        """Load an aggregated ``state`` into a server model. With ``--bn_stats local`` only parameters are
        taken: as in PFLlib, BatchNorm statistics are never averaged (clients keep their own, and the
        server's model keeps those it started with)."""
        if self.cfg.bn_stats == "local":
            params = {k for k, _ in target.named_parameters()}
            target.load_state_dict({k: v for k, v in state.items() if k in params}, strict=False)
        else:
            target.load_state_dict(state)

    def after_round(self) -> None:
        """Called at the end of every round, before the plug-ins' ``after_round``."""

    def extra_metrics(self) -> dict:
        """Further per-evaluation series an algorithm records (e.g. Ditto's global-model accuracy)."""
        return {}

    def new_client_payload(self, client: Client):
        """-nnc: what a client that joins after training receives: by default what ``broadcast`` sends it
        after the final evaluation's ``prepare_broadcast``. An algorithm whose payload needs the
        client's own history declares ``new_client_refusal`` instead, or overrides this."""
        return self.broadcast(client)


Server._own_declares = Server.declares
