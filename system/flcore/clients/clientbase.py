"""Client: one participant's data, model, optimizer and local training: what an algorithm overrides or calls.

Subclasses override small hooks, never the loop: ``receive`` / ``initialize_local`` (what arrives from
the server, and local initialisation: ALA lives here), ``loss`` (extra terms such as FedProx's proximal
term), ``after_backward`` (gradient corrections), ``local_update`` (a round's training procedure, built
from ``run_epochs``), ``steps_per_round`` (when that procedure takes another number of steps),
``upload`` (what crosses the wire: an ``Upload``) and ``eval_model`` (which model is evaluated); what the
client is, in one declaration (``declares``, utils/declares.py: also the modules its training steps, the
batched executor's step, the model a late joiner fine-tunes). A client's training batches are functions of
the client in utils/batching.py (``batches``, ``batches_per_epoch``, ``train_count``), drawn from the
samples its ``train_indices`` names.

The engine's own steps on a client are not its members: a round's training, the evaluations and a late
join are runtime/client_steps.py, its checkpointed state runtime/checkpoint.py, DP-SGD's step
``utils.dp_sgd.dp_backward`` and its epsilon plugins/dp_sample.py, the backdoor's figure
plugins/attack.py. A subclass that still defines one of those, or one of the members that moved to the
declaration or to utils/batching.py, or reads one as ``self.<name>``, stops at import with one line
(``MOVED``).

The server reaches a client only through calls (runtime/executors.py), so a client may live in this
process or in a worker process; its state has one home, the client object. A client parked off the
device (``--client_state``) is brought back by the executor before any use, never implicitly.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time

import torch
from torch import nn

import plugins
from flcore.trainmodel.parts import HEAD, ala_names, batch_dependent, head_of
from utils.amp import autocast, make_scaler
from utils.batching import batches, batches_per_epoch, has_batch_norm, session, sgd_step
from utils.data_utils import ClientData, local_split
from utils import dp_sgd
from utils.declares import ClientDeclares, moved_to_declares, settle
from utils.errors import Diverged
from utils.metrics import auc_ovr, predict
from utils.seeding import torch_gen


@dataclasses.dataclass
class Upload:
    """What a client sends the server after training.

    ``weight``: its aggregation weight (training samples for FedAvg); ``state``: model entries by name
    (the whole model, a part such as FedRep's body, or None when no model is sent); ``extras``: whatever
    else the algorithm sends (SCAFFOLD's control-variate change, prototypes, logits), by name."""
    id: int
    weight: float
    state: dict | None = None
    extras: dict = dataclasses.field(default_factory=dict)


# What a Client subclass may no longer define, and where that responsibility lives now (one line each).
MOVED = {
    "train": "a round's local training is runtime.client_steps.train(client, round); override local_update",
    "test_metrics": "evaluation is runtime.client_steps.test_metrics(client); which model is evaluated: eval_model",
    "train_metrics": "runtime.client_steps.train_metrics(client) evaluates eval_model on the training split",
    "val_metrics": "runtime.client_steps.val_metrics(client) evaluates eval_model on the validation split",
    "join_late": "-nnc is runtime.client_steps.join_late(client, payload, epochs); the model it fine-tunes is "
                 "declares.new_client_model",
    "check_finite": "runtime.client_steps.check_finite(client, logits, split)",
    "train_loss_sample": "runtime.client_steps.train_loss_sample(client)",
    "backdoor_metrics": "the backdoor attack's figure is plugins.attack.backdoor_metrics(client)",
    "dp_epsilon": "-dp's epsilon is plugins.dp_sample.dp_epsilon(client, delta)",
    "dp_backward": "-dp's step is utils.dp_sgd.dp_backward(client, objective, optimizer, x, y); name the modules in "
                   "declares.dp_modules",
    "state_dict": "a client's state is runtime.checkpoint.client_state(client); leave attributes out with "
                  "declares.checkpoint_skip, rebuild a module with new_module",
    "load_state_dict": "runtime.checkpoint.load_client_state(client, saved) restores a client",
    "checkpoint_links": "runtime.checkpoint.client_links(client)",
    "checkpoint_fixed": "runtime.checkpoint.CLIENT_FIXED",
    "checkpoint_built": "runtime.checkpoint.CLIENT_BUILT",
    "batches": "a client's batches are utils.batching.batches(client, epochs, batch_size, generator), drawn from "
               "the samples train_indices names",
    "batches_per_epoch": "utils.batching.batches_per_epoch(client, batch_size); a procedure with another step "
                         "count overrides steps_per_round",
    "train_count": "utils.batching.train_count(client) counts the samples train_indices names; a procedure "
                   "with another step count overrides steps_per_round",
    "dp_modules": "the modules local training steps are named by attribute in the declaration: declares = "
                  "ClientDeclares(dp_modules=(\"model\", ...)) (utils/declares.py); utils.dp_sgd.dp_modules(client) "
                  "gives them",
    "batched_step": "--executor batched's step is a function in the declaration: declares = "
                    "ClientDeclares(batch_step=f), f(params, grads, lrs) -> params (utils/declares.py)",
    "new_client_model": "-nnc's model is named by attribute in the declaration: declares = "
                        "ClientDeclares(new_client_model=\"model\") (utils/declares.py); None: eval_model",
}


class Client:
    # What the algorithm's client keeps to itself and how it may train (utils/declares.py documents every
    # field); a subclass names only the fields it changes.
    declares = ClientDeclares(
        personal_keys=(),
        use_ala=False,
        dp_modules=("model",),
        batch_state=None,
        batch_step=sgd_step,
        new_client_model=None,
        checkpoint_skip=(),
    )

    def __init_subclass__(cls, **kwargs):
        """Settle the subclass's ``declares`` (utils/declares.py). A subclass written for the members this class
        used to carry (an engine step or a helper, ``MOVED``, defined or read as ``self.<name>``; a
        declaration attribute, now a field of ``declares``) stops here, at import, with one line naming where
        that responsibility lives now."""
        super().__init_subclass__(**kwargs)
        moved = {k: f"no longer a Client member; {v}" for k, v in MOVED.items()}
        settle(cls, ClientDeclares, {**moved_to_declares(ClientDeclares), **moved}, moved)

    def __init__(self, cfg, cid: int, data: ClientData, model: nn.Module, run: int = 0):
        self.cfg, self.id, self.run = cfg, cid, run
        self.device = torch.device(cfg.device)
        data = local_split(data, cfg, run, cid)  # -fs, --val_ratio
        # the plug-ins' say on the training data (--attack labelflip: y -> C-1-y; backdoor: triggered images)
        data = plugins.client_data(cfg, run, cid, data)
        self.x_train, self.y_train = data.x_train, data.y_train
        self.x_test, self.y_test = data.x_test, data.y_test
        self.x_val, self.y_val = data.x_val, data.y_val  # None without --val_ratio
        self.white = data.white  # images: a full-intensity pixel, where --attack backdoor stamps its trigger
        self.train_samples, self.test_samples = len(self.y_train), len(self.y_test)
        self.num_classes = cfg.num_classes
        self.model = copy.deepcopy(model)
        self.merge_single = has_batch_norm(self.model)  # no 1-sample training batch for BatchNorm
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = self.make_optimizer()
        # Batch order is this client's own stream: the same seed gives the same batches on any executor.
        self.batch_gen = torch_gen(cfg.seed, run, "batches", cid)
        self.scaler = make_scaler(cfg, self.device)  # --amp fp16 only
        self.loss_sample: torch.Tensor | None = None  # --train_loss_eval sampled (train_loss_sample)
        self.ala = None
        if cfg.ala or self.declares.use_ala:
            from utils.ALA import ALA

            # The classifier's inputs can be computed once per round unless a layer mixes a batch's samples.
            head = None if batch_dependent(self.model) else HEAD
            self.ala = ALA.from_config(cfg, cid, run, ala_names(self.model, cfg.layer_idx, cfg.ala_layers), head)
        self.train_time: list[float] = []  # seconds of each local training, one entry per round trained
        # the model entries (name prefixes) that never cross the wire: the declared ones, unless this client's
        # own model decides them (FedBN's BatchNorm layers)
        self.personal_keys = self.declares.personal_keys
        self.dp = None  # -dp: this client's DP-SGD noise stream and accountant history (plugins/dp_sample.py)
        plugins.setup_client(cfg, self)  # what the plug-ins keep on a client (DP-SGD's accountant)

    # ---- hooks -------------------------------------------------------------------------------------
    def make_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of ``self.model``'s local training, built once by the constructor: SGD at ``-lr``
        (``runtime.client_steps.train`` sets each round's rate into its groups)."""
        return torch.optim.SGD(self.model.parameters(), lr=self.cfg.local_learning_rate)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The objective of one batch: cross-entropy of ``self.model``; an algorithm adds its terms (FedProx's
        proximal term)."""
        return self.loss_fn(self.model(x), y)

    def after_backward(self) -> None:
        """Called between ``backward`` and ``optimizer.step`` (gradient corrections)."""

    def receive(self, payload, participating: bool = True) -> None:
        """What ``Server.broadcast`` sent this client (by default the global model). By default the
        client's model becomes the global model (or, with ALA, is initialised from it by adaptive local
        aggregation when the client takes part in the round). ``participating``: whether the client
        trains this round (the others receive only to be evaluated)."""
        self.initialize_local(self.model, payload, participating)

    def initialize_local(self, target: nn.Module, global_model: nn.Module, participating: bool = True) -> None:
        """The one place where a local model is initialised from the global model: a plain copy, or ALA
        (``-ala``) for the round's participants. Algorithms that receive into another model (Ditto's,
        FedRep's body) call this from ``receive`` with their own ``target``, which is how they all get
        "+ALA". A client that does not take part keeps its model, unless ``--ala_clients all`` (PFLlib's
        rule: every client runs ALA before every evaluation)."""
        if self.ala is None or not self.train_time:
            # Without ALA, or before this client has trained at all (its model is still the common
            # initialisation: the paper's round 1), the global model is taken as is (with --bn_stats
            # local its parameters only).
            copy_state(target, global_model, buffers=self.cfg.bn_stats == "shared")
        elif participating or self.cfg.ala_clients == "all":
            self.ala.adaptive_local_aggregation(global_model, target, self.x_train, self.y_train)

    def upload(self) -> Upload:
        """What crosses the wire to the server: the model state, weighted by the training samples."""
        return Upload(self.id, self.train_samples, self.model.state_dict())

    def steps_per_round(self) -> int:
        """Local optimizer steps that move the uploaded model in one round of ``local_update``: ``-ls``
        epochs of ceil(samples / ``-lbs``) batches here. An algorithm whose procedure takes another
        number overrides it (Per-FedAvg's steps use two batches each); FedRep's head epochs, Ditto's
        personal epochs and pFedMe's inner steps do not move the uploaded model and are not counted. Every
        reader uses this one count: the DLG update target, the simulated slow clients (``-tsr``), and an
        algorithm's own K (SCAFFOLD's control-variate update)."""
        return self.cfg.local_epochs * batches_per_epoch(self)

    def train_indices(self) -> torch.Tensor | None:
        """The training samples local training draws its batches from (indices), None for all of them.
        An algorithm that holds some back from its update (PartialFed's held-out slice) overrides this;
        utils/batching.py's ``batches``, ``batches_per_epoch`` and ``train_count`` read it."""
        return None

    def eval_model(self) -> nn.Module:
        """The client's personalised model, the one evaluated on its own test split."""
        return self.model

    # ---- state (checkpoints and parking: runtime/state.py) ------------------------------------------
    def new_module(self, name: str) -> nn.Module:
        """A module for attribute ``name`` of a saved state that the constructor does not build (a copy
        made later, such as a fine-tuned or a previous model): by default a copy of ``self.model``, into
        which the saved entries are loaded (strictly, so another structure is refused)."""
        return copy.deepcopy(self.model)

    # ---- training ----------------------------------------------------------------------------------
    def learning_rate(self, round_idx: int) -> float:
        """Per-round rate: lr * gamma^round with ``-ld`` (a function of the round, not of how often this
        client happened to train, unlike a per-client scheduler)."""
        lr = self.cfg.local_learning_rate
        return lr * self.cfg.learning_rate_decay_gamma ** round_idx if self.cfg.learning_rate_decay else lr

    def local_update(self, round_idx: int) -> None:
        """The local training procedure of one round (timed by ``train``): ``-ls`` epochs of SGD on
        ``loss``. Algorithms with several phases (FedRep's head then body, Ditto's second model) or another
        step rule (Per-FedAvg) replace this, built from ``run_epochs``."""
        self.run_epochs(self.cfg.local_epochs)

    def run_epochs(self, epochs: int, batch_size: int | None = None, *, optimizer=None, objective=None,
                   generator: torch.Generator | None = None, step=None) -> float:
        """SGD on ``self.loss`` for ``epochs`` passes; returns the mean batch loss. A non-finite loss stops
        the run with a clear error (checked once at the end, so the hot loop never synchronises).

        ``optimizer`` / ``objective(x, y)`` train another model with the same loop (Ditto's personal
        model, a fine-tuned copy); ``after_backward`` then does not run, as it corrects ``self.model``.
        ``generator`` draws the batches from another stream (see ``utils.batching.batches``). ``step(x, y) -> loss``
        replaces the whole update of one batch (pFedMe's inner problem, Per-FedAvg's private meta-step);
        the batches, the loss bookkeeping and the divergence check stay this loop's. Under ``--executor
        batched`` a phase without ``step`` runs stacked with the other clients' (runtime/batched.py)."""
        batched = session()
        if batched is not None and step is None:
            return batched.run_epochs(self, epochs, batch_size, optimizer, objective, generator)
        if step is None:
            own = optimizer is None
            optimizer = self.optimizer if own else optimizer
            objective = self.loss if objective is None else objective
            step = lambda x, y: self._sgd_step(x, y, optimizer, objective, own)  # noqa: E731
        total, steps = torch.zeros((), device=self.device), 0
        for idx in batches(self, epochs, batch_size, generator):
            total += step(self.x_train[idx], self.y_train[idx]).detach()
            steps += 1
        mean = float(total) / max(steps, 1)
        if not torch.isfinite(total):
            raise Diverged(f"client {self.id}: training loss became {mean}; lower -lr (now "
                          f"{self.cfg.local_learning_rate}) or check the data")
        return mean

    def _sgd_step(self, x: torch.Tensor, y: torch.Tensor, optimizer, objective, own: bool) -> torch.Tensor:
        """One optimizer step on ``objective(x, y)`` (DP-SGD with ``-dp``, loss-scaled with ``--amp fp16``);
        ``after_backward`` runs when ``own`` (the client's model and optimizer). Returns the batch loss."""
        optimizer.zero_grad(set_to_none=True)
        if self.dp is None:
            with autocast(self.cfg, self.device):
                loss = objective(x, y)
            if self.scaler is None:
                loss.backward()
            else:  # --amp fp16 (main.py rejects it with -dp)
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(optimizer)  # after_backward sees true gradients
        else:  # -dp: clipped, noised per-sample gradients of the same objective
            loss = dp_sgd.dp_backward(self, objective, optimizer, x, y)
        if own:
            self.after_backward()
        if self.scaler is None:
            optimizer.step()
        else:  # skips the step when the fp16 gradients overflowed, then adapts the scale
            self.scaler.step(optimizer)
            self.scaler.update()
        return loss



Client._own_declares = Client.declares

def copy_state(target: nn.Module, source: nn.Module, buffers: bool = True) -> None:
    """Overwrite ``target``'s parameters and (unless ``buffers`` is False: BatchNorm statistics stay the
    target's own) its buffers with ``source``'s, in place."""
    dst = target.state_dict()
    keep = set() if buffers else {k for k, _ in target.named_buffers()}
    with torch.no_grad():
        for k, v in source.state_dict().items():
            if k not in keep:
                dst[k].copy_(v)
