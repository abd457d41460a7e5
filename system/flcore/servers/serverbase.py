"""Server: the one round loop, client selection, aggregation, evaluation and result files.

Round t (0-based, ``-gr`` rounds in all), ``run_round(t)``:
    select_clients -> _send_models (``prepare_broadcast``, then ``broadcast(client)`` decides each client's
    payload, by default the global model; ``client.receive(payload, participating)`` runs its local
    initialisation, e.g. ALA) -> evaluate (every ``-eg`` rounds, on the models just initialised, as PFLlib
    does) -> _train_clients -> _receive_models (each active client's ``upload()``, an ``Upload``)
    -> aggregate -> after_round. The loop's own steps are private (``_``): an algorithm changes a round
    through the hooks only.
After the last round the final global model is sent once more (to a selection drawn as for a round) and
evaluated, so a run of R rounds has evaluations at rounds 0 (initial model), eg, 2eg, ... and R, all by
one rule: every client receives the broadcast; the selected ones run their local initialisation (ALA, with
``--ala_clients all`` every client does), and each client's own model is evaluated. The cross-cutting features
(attacks, robust aggregation, server optimizers, DP, the DLG monitor: plugins/) act at the round's named
points, the loop calling every plug-in the flags turn on (``self.plugins``) without naming any; the
algorithms need not know. What an algorithm cannot take is its declarations: ``dp_support``,
``averaging_refusal``, ``robust_refusal``.

A new algorithm subclasses ``Server`` (setting ``client_class``) and overrides only the hooks it changes:
``add_args`` / ``check_config`` (its flags), ``build_model``, ``select_clients``, ``prepare_broadcast`` /
``broadcast`` (what goes down), ``aggregate`` (what the uploads become; ``load_aggregate`` loads a state),
``extra_metrics``, ``after_round`` (README's hooks table is the whole surface).

Clients live where the executor puts them (runtime/executors.py): in this process, in forked worker
processes (the CPU default) or in Ray workers, where ``self.clients`` holds ``ClientHandle`` proxies. A
server therefore talks to its clients through method calls only (``self.call_clients(clients, "m", *args)``,
``self.call_each("m", [(c, args), ...])``, or ``c.m(...)`` for one client); reading an attribute gives a
copy, and writing one is refused. Fault
tolerance, checkpoints and resume: runtime/checkpoint.py; simulated slow clients: runtime/faults.py.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import time

import numpy as np
import torch
from tqdm import tqdm

from flcore.clients.clientbase import Client, Upload
from flcore.trainmodel.assign import assign, read_client_models
from flcore.trainmodel.models import build_client_model, build_model, set_device_layout
from flcore.trainmodel.parts import shared_shapes
from runtime import checkpoint, state
from runtime.choose import make_executor
from runtime.executors import ClientFactory, WorkerLost
from runtime.faults import SlowClients
from plugins import build_all
from utils.aggregate import weighted_average
from utils.comm import payload_bytes
from utils.data_utils import FederatedData
from utils.entries import SealedUpload
from utils.dp_support import DPSupport
from utils.errors import Diverged, FLError
from utils.metrics import summarize
from utils.model_support import ModelSupport, check_same_shape
from utils.results import RunRecorder
from utils.seeding import np_rng, torch_seeded
from utils.selection import select


class Server:
    client_class = Client
    # False for traditional FL, whose clients are evaluated on the global model; the behaviour tests expect
    # every personalised algorithm to beat FedAvg on a pathological split (tests/test_behaviour.py).
    personalized = True
    # -dp: the one privacy declaration (utils/dp_support.py DPSupport): why it refuses DP-SGD or client-level DP,
    # and what its epsilon does not cover; checked at start-up, docs/privacy.md's table is made from it.
    dp_support = DPSupport()
    # -nnc: why a client that never trained has no defined start here (refused at start-up), "" when it
    # has one: it receives ``new_client_payload`` (by default what ``broadcast`` sends every client).
    new_client_refusal = ""
    # --client_models: the one declaration (utils/model_support.py ModelSupport) of whether clients may train
    # different architectures, what they then share and which part must have one shape; by default refused.
    model_support = ModelSupport()
    # --server_opt / --aggregator / upload attacks: why this server does not average a model (refused at
    # start-up), "" when its ``aggregate`` averages uploads through ``average_uploads`` (the one path).
    averaging_refusal = ""
    # --aggregator: why a robust rule cannot guard this server (refused at start-up), "" when every computation
    # of its server that reads uploaded content goes through ``average_uploads`` (tests/test_no_bypass.py).
    robust_refusal = ""
    # -slr's default where the algorithm's own server step reads it without --server_opt (SCAFFOLD, FedGH).
    slr_default: float | None = None

    # PFLlib's defaults (its main.py) of the flags this class adds, where PFLlib has them: the start-up print
    # marks run values that differ (cli.print_config).
    pfllib_defaults: dict = {}

    @classmethod
    def add_args(cls, parser) -> None:
        """Add this algorithm's own flags to ``parser`` (defaults from its paper)."""

    @classmethod
    def pfllib_flag_defaults(cls) -> dict:
        """``pfllib_defaults`` of this class and its bases (FedProx-C: FedProx's and fine-tuning's)."""
        return {k: v for c in reversed(cls.__mro__) for k, v in vars(c).get("pfllib_defaults", {}).items()}

    @classmethod
    def check_config(cls, cfg) -> None:
        """Reject flag combinations this algorithm cannot honour (raise FLError with one clear line)."""

    checkpoint_skip = ("checkpoints",)  # attributes a checkpoint leaves out
    checkpoint_fixed = ("run",)  # whose run the state is: a saved state must hold the same value
    # built from the flags by the constructor: where the fresh server holds None, a saved state holds None too
    checkpoint_built = ("client_model_names",)  # (the plug-ins: a list, built from the flags as the saved one was)

    def __init__(self, cfg, data: FederatedData, run: int = 0, recorder: RunRecorder | None = None,
                 executor=None):
        cfg = cfg.replace(num_clients=len(data.clients))  # -nc cut the split already; None meant all
        self.cfg, self.data, self.run = cfg, data, run
        self.device = torch.device(cfg.device)
        # --client_models: each client's architecture, trained clients then new ones (-nnc); None without it
        self.client_model_names = None if cfg.client_models is None else assign(
            read_client_models(cfg.client_models), len(data.clients) + len(data.new_clients))
        self.global_model = self.initial_model()
        self.executor = executor if executor is not None else make_executor(cfg, self.client_class)
        self.clients = self.executor.start(self.client_factory(), data.clients)
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
        # the cross-cutting features the flags turn on (plugins/), called at the round's points; their state
        # is part of the checkpointed state
        self.plugins = build_all(cfg, self)
        self.averaged = False  # whether this round's aggregate went through average_uploads
        self.selected: list[Client] = []
        self.round_idx = 0
        self.bytes_down = self.bytes_up = 0  # of the current round: what _send_models / _receive_models moved

    def initial_model(self) -> torch.nn.Module:
        """The run's common initial model (the same every time it is asked for)."""
        with torch_seeded(self.cfg.seed, self.run, "model"):
            return set_device_layout(self.build_model().to(self.device), self.device)

    def build_model(self, name: str | None = None) -> torch.nn.Module:
        """The model ``-m``; with ``--client_models`` the architecture ``name`` (default ``-m``), its
        classifier taking ``-fd`` features (``models.build_client_model``). An algorithm that reshapes its
        model (a head/body split) overrides this, so every client's architecture is reshaped alike."""
        build = build_model if self.cfg.client_models is None else build_client_model
        return build(self.cfg.model if name is None else name, self.data.input_shape, self.data.num_classes,
                     self.cfg.feature_dim, self.cfg.vocab_size, config=self.data.config)

    def client_models(self) -> dict[int, torch.nn.Module]:
        """``--client_models``: client id -> the initial model of its architecture (one per architecture,
        seeded by its name, as every client starts from one model without the flag): reshaped by
        ``build_model``, or as built where it is a personal model beside the shared one
        (``model_support.personal``). The part ``model_support.same_shape`` names must have one shape on
        every architecture and the server's model, or the run stops here with one line."""
        support = self.model_support
        built = {}
        for name in dict.fromkeys(self.client_model_names):
            with torch_seeded(self.cfg.seed, self.run, "client-model", name):
                model = Server.build_model(self, name) if support.personal else self.build_model(name)
            built[name] = set_device_layout(model.to(self.device), self.device)
        if support.same_shape:
            x = self.data.clients[0].x_train[:1].to(self.device)
            shapes = {name: shared_shapes(m, support.same_shape, x) for name, m in built.items()}
            if support.same_shape == "head":
                shapes["the server's model"] = shared_shapes(self.global_model, "head", x)
            check_same_shape(self.cfg, support.same_shape, shapes)
        return {cid: built[name] for cid, name in enumerate(self.client_model_names)}

    def client_factory(self) -> ClientFactory:
        """How every client is built, here or inside a worker: ``client_class(cfg, cid, data,
        global_model, run)`` under its own seeded stream; with ``--client_models`` each client's own
        architecture (``client_models``) replaces the global model, or with ``model_support.personal`` comes
        as the keyword ``own_model``. Construction-time logic belongs in the client's ``__init__``; set-up
        calls a server makes on its clients after construction are fine too."""
        if self.client_model_names is None:
            return ClientFactory(self.client_class, self.cfg, self.run, self.global_model)
        return ClientFactory(self.client_class, self.cfg, self.run, self.global_model, self.client_models(),
                             self.model_support.personal)

    # ---- calling clients ---------------------------------------------------------------------------
    def call_clients(self, clients: list[Client], method: str, *args) -> list:
        """``c.method(*args)`` for each of ``clients``, wherever the executor holds them (one after the
        other, or in parallel in workers); the results in order. How a server asks its clients anything
        (APFL's mixing weights, FedDBE's initial means)."""
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

    def _send_models(self, participants: list[Client]) -> None:
        """Every client receives its payload; ``participants`` (the round's selection) are told they train."""
        self.prepare_broadcast(participants)
        chosen = {c.id for c in participants}
        calls, sizes = [], {}
        for c in self.clients:
            payload = self.broadcast(c)
            if payload is not None:
                calls.append((c, (payload, c.id in chosen)))
                if id(payload) not in sizes:
                    sizes[id(payload)] = payload_bytes(payload)
                self.bytes_down += sizes[id(payload)]
        for p in self.plugins:
            p.on_broadcast(self, [args[0] for _, args in calls])
        self.call_each("receive", calls)

    def _active_clients(self, participants: list[Client]) -> list[Client]:
        """Participants that do not drop out this round (``-cdr``): each drops independently with that
        probability, drawn from the drop stream; dropped clients neither train nor upload."""
        if self.cfg.client_drop_rate <= 0:
            return participants
        keep = self.drop_rng.random(len(participants)) >= self.cfg.client_drop_rate
        return [c for c, k in zip(participants, keep) if k]

    def _train_clients(self, clients: list[Client]) -> None:
        """The single dispatch point of local training (one after the other, or in parallel in workers)."""
        self.call_clients(clients, "train", self.round_idx)

    def _receive_models(self, clients: list[Client]) -> list[Upload]:
        """Uploads of the clients that finish within ``-tth`` (simulated slow clients, runtime/faults.py)."""
        late = self.slow.late([c.id for c in clients], self.round_idx)
        self.late = sorted(late)
        uploads = self.call_clients([c for c in clients if c.id not in late], "upload")
        self.bytes_up += sum(payload_bytes(u) for u in uploads)
        return uploads

    def _aggregate(self, uploads: list[Upload]) -> None:
        """The round's aggregation step: the algorithm's ``aggregate``, wrapped by the plug-ins'
        ``wrap_aggregate`` (DP-FedAvg with ``--dp_level client``). Where a plug-in acts on
        ``average_uploads`` (``averages``: a robust rule, a server optimizer), the algorithm's ``aggregate``
        must have gone through it."""
        self.averaged = False
        step = self.aggregate
        for p in reversed(self.plugins):  # the first plug-in's wrapper is the outermost
            step = p.wrap_aggregate(self, step)
        step(uploads)
        if uploads and not self.averaged and any(p.averages for p in self.plugins):
            raise FLError(f"--server_opt / --aggregator: {self.cfg.algorithm}'s aggregate does not go through "
                          f"average_uploads; it must declare averaging_refusal")

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

    # ---- evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        train_loss = self.cfg.train_loss_eval != "off"
        tests = self.call_clients(self.clients, "test_metrics")
        trains = self.call_clients(self.clients, "train_metrics") if train_loss else None
        tests = np.array(tests, dtype=np.float64)
        trains = np.array(trains, dtype=np.float64) if train_loss else np.zeros((len(self.clients), 2))
        summary = summarize(tests[:, 0], tests[:, 1], tests[:, 2], trains[:, 0], trains[:, 1])
        if train_loss and not np.isfinite(summary["train_loss"]):  # as a non-finite training loss does
            raise Diverged(f"round {self.round_idx}: the evaluated train loss is {summary['train_loss']}; lower -lr "
                           f"(now {self.cfg.local_learning_rate}) or check the model and the data")
        for p in self.plugins:  # the benign clients' summary (--attack), DP epsilon (-dp), ...
            summary.update(p.metrics(self, tests, trains))
        if self.cfg.val_ratio > 0:  # sample-weighted, as test_acc
            correct, n = np.array(self.call_clients(self.clients, "val_metrics"), dtype=np.float64).sum(0)
            summary["val_acc"] = float(correct / n)
        summary.update(self.extra_metrics())
        return summary

    def extra_metrics(self) -> dict:
        """Further per-evaluation series an algorithm records (e.g. Ditto's global-model accuracy)."""
        return {}

    def _record(self, summary: dict) -> None:
        loss = "" if self.cfg.train_loss_eval == "off" else f" | train loss {summary['train_loss']:.4f}"
        val = f" | val acc {summary['val_acc']:.4f}" if "val_acc" in summary else ""
        words = [p.describe(summary) for p in self.plugins]  # the plug-ins' own figures (benign acc, epsilon)
        before, after = "".join(w[0] for w in words), "".join(w[1] for w in words)
        tqdm.write(f"round {self.round_idx:4d} | {before}acc {summary['test_acc']:.4f} "
                   f"(clients {summary['test_acc_mean']:.4f} ± {summary['test_acc_std']:.4f}, worst "
                   f"{summary['test_acc_min']:.4f}){val} | auc {summary['test_auc']:.4f}{loss}{after}")
        if self.recorder is not None:
            self.recorder.add(self.round_idx, summary)
            self.recorder.save()

    def _should_stop(self) -> bool:
        """``-ab``: stop once the best accuracy is more than ``-tc`` evaluations old."""
        if not self.cfg.auto_break or self.recorder is None:
            return False
        acc = self.recorder.series.get("rs_test_acc", [])
        if not acc:  # before the first evaluation (round 0) there is nothing to compare
            return False
        return len(acc) - 1 - int(np.argmax(acc)) > self.cfg.top_cnt

    # ---- state (checkpoints: runtime/checkpoint.py, runtime/state.py) --------------------------------
    def checkpoint_links(self) -> dict:
        """Objects a saved state refers to rather than holds (wherever they occur in the server's
        attributes): they are rebuilt from the flags and the split, or live elsewhere."""
        return {"cfg": self.cfg, "data": self.data, "recorder": self.recorder, "executor": self.executor,
                **{f"client:{c.id}": c for c in self.clients}}

    def state_dict(self) -> dict:
        """This server's state as tensors and plain values (runtime/state.py): by default every attribute
        but ``checkpoint_skip`` (global model, streams, an algorithm's own state such as stored client
        models)."""
        links = {id(v): k for k, v in self.checkpoint_links().items() if v is not None}
        return state.encode_attrs(self, links, self.checkpoint_skip, "server")

    def load_state_dict(self, saved: dict) -> None:
        """Put a ``state_dict`` back onto this server, as built by its constructor."""
        state.decode_attrs(self, saved, self.checkpoint_links(), self.device, "server", self.new_module)

    def new_module(self, name: str) -> torch.nn.Module:
        """A module for attribute ``name`` of a saved state that the constructor does not build: by default
        a copy of the global model, into which the saved entries are loaded (strictly)."""
        return copy.deepcopy(self.global_model)

    def close(self) -> None:
        """Release the executor's workers (main.py closes the executor it shares between runs)."""
        self.executor.close()

    # ---- the loop ----------------------------------------------------------------------------------
    def train(self) -> None:
        """Run every round. ``--resume`` continues from the run's checkpoint. A lost worker sends the run
        back to its last checkpoint (round 0 without ``--checkpoint_every``) and the rounds are replayed:
        every draw is seeded, so the numbers are those of an undisturbed run."""
        first = self.checkpoints.begin(self)
        for restarts in itertools.count():
            try:
                return self._run_rounds(first)
            except WorkerLost as e:
                if restarts >= self.cfg.max_restarts:
                    raise FLError(f"{e}, {restarts + 1} time(s) in this run (--max_restarts "
                                  f"{self.cfg.max_restarts}); results so far are kept; rerun with --resume to "
                                  f"continue from the last checkpoint") from None
                self.clients = self.executor.reset()
                first = self.checkpoints.recover(self, e)

    def _run_rounds(self, first: int) -> None:
        """Rounds ``first`` .. ``-gr``-1, then the final evaluation (of round ``-gr``, or of the round
        ``-ab`` stopped before; ``-gr 0`` evaluates the initial model as round 0)."""
        cfg = self.cfg
        done = first
        for t in tqdm(range(first, cfg.global_rounds), desc=f"{cfg.algorithm} run {self.run}", leave=False,
                      disable=not cfg.progress, initial=first, total=cfg.global_rounds):
            if self._should_stop():  # checked before a round, so a resumed run stops where it stopped
                break
            self.run_round(t)
            done = t + 1
        self._final_evaluation(done)

    def run_round(self, t: int) -> None:
        """Round ``t``: broadcast, evaluation every ``-eg`` rounds, local training, upload, aggregation,
        ``after_round``, then its wall time and (with ``--checkpoint_every``) a checkpoint."""
        cfg = self.cfg
        self.round_idx = t
        start = time.perf_counter()
        self.bytes_down = self.bytes_up = 0
        self.selected = self.select_clients()
        self._send_models(self.selected)
        if t % cfg.eval_gap == 0:
            self._record(self.evaluate())
        active = self._active_clients(self.selected)
        for p in self.plugins:  # -dlg: the attacked clients' start models
            p.before_training(self, active)
        self._train_clients(active)
        uploads = self._receive_models(active)
        for p in self.plugins:  # --attack poisons the malicious uploads; -dlg attacks what they upload
            uploads = p.on_uploads(self, active, uploads)
        self._aggregate(uploads)
        self.after_round()
        for p in self.plugins:
            p.after_round(self)
        if self.recorder is not None:
            self.recorder.round_time.append(time.perf_counter() - start)
            self.recorder.round_bytes["up"].append(self.bytes_up)
            self.recorder.round_bytes["down"].append(self.bytes_down)
        if cfg.checkpoint_every and ((t + 1) % cfg.checkpoint_every == 0 or t + 1 == cfg.global_rounds):
            self.checkpoints.save(self, t)

    def _final_evaluation(self, round_idx: int) -> None:
        """After the last round, the final global model is evaluated by the rule of every other evaluation:
        as the first half of one more round (selection, broadcast, evaluation), without training. With
        ``-jr`` < 1 the selected clients initialise from it (ALA) and the others are evaluated on their own
        current model, as in every round (``--ala_clients all``: every client runs ALA, as in PFLlib)."""
        self.round_idx = round_idx
        self.selected = self.select_clients()
        self._send_models(self.selected)
        self._record(self.evaluate())
        if self.data.new_clients:
            self.evaluate_new_clients()

    def new_client_payload(self, client: Client):
        """-nnc: what a client that joins after training receives: by default what ``broadcast`` sends it
        after the final evaluation's ``prepare_broadcast``. An algorithm whose payload needs the
        client's own history sets ``new_client_refusal`` instead, or overrides this."""
        return self.broadcast(client)

    def evaluate_new_clients(self) -> dict:
        """-nnc: every client held out of training is built here (ids after the trained ones, in this
        process, from the common initial model), receives ``new_client_payload``, fine-tunes ``-ften``
        epochs and is evaluated on its test split (``Client.join_late``). Recorded once, at the final
        round, as the ``new`` series (``rs_new_test_acc``, ``rs_new_client_test_acc``, ...); returns
        that summary."""
        factory = dataclasses.replace(self.client_factory(), model=self.initial_model())
        tests = []
        for i, d in enumerate(self.data.new_clients):
            client = factory(len(self.clients) + i, d)
            tests.append(client.join_late(self.new_client_payload(client), self.cfg.fine_tuning_epoch_new))
        tests = np.array(tests, dtype=np.float64)
        none = np.zeros(len(tests))
        summary = summarize(tests[:, 0], tests[:, 1], tests[:, 2], none, none)
        tqdm.write(f"new clients ({len(tests)}, {self.cfg.fine_tuning_epoch_new} fine-tuning epoch(s)) | acc "
                   f"{summary['test_acc']:.4f} (clients {summary['test_acc_mean']:.4f} ± "
                   f"{summary['test_acc_std']:.4f}, worst {summary['test_acc_min']:.4f}) | auc {summary['test_auc']:.4f}")
        summary.pop("train_loss")
        if self.recorder is not None:
            self.recorder.add_series("new", self.round_idx, summary)
            self.recorder.save()
        return summary
