"""Client: one participant's data, model, optimizer, local training and evaluation.

Subclasses override small hooks, never the loop: ``receive`` / ``initialize_local`` (what arrives from
the server, and local initialisation: ALA lives here), ``loss`` (extra terms such as FedProx's proximal
term), ``after_backward`` (gradient corrections), ``local_update`` (a round's training procedure, built
from ``run_epochs``), ``steps_per_round`` (when that procedure takes another number of steps),
``upload`` (what crosses the wire: an ``Upload``) and ``eval_model`` (which model is evaluated).

The server reaches a client only through method calls (runtime/executors.py), so a client may live in
this process or in a worker process; its state has one home, the client object.
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
from runtime import state
from runtime.stacked import sgd_step
from utils.amp import autocast, make_scaler
from utils.batching import batch_bounds, batches_of, has_batch_norm, session
from utils.data_utils import ClientData, local_split
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


class Client:
    use_ala = False  # FedALA sets this; any other algorithm gets ALA with -ala
    # Entries of ``self.model``'s state (name prefixes) that are this client's own and never cross the
    # wire: FedRep's head ("head."), all of Local's model (""). Every algorithm's uploads are checked
    # against them (tests/test_executors.py).
    personal_keys: tuple[str, ...] = ()
    # --executor batched (runtime/batched.py): None, this algorithm's local update is not declared
    # batchable; else the attributes besides the ``dp_modules`` that its ``loss`` (and its phases' objectives)
    # read and that differ between clients (FedProx's anchor), stacked per client. A subclass that overrides a
    # training hook below the declaring class is refused (``runtime.batched.batch_refusal``).
    batch_state: tuple[str, ...] | None = None

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
        if cfg.ala or self.use_ala:
            from utils.ALA import ALA

            # The classifier's inputs can be computed once per round unless a layer mixes a batch's samples.
            head = None if batch_dependent(self.model) else HEAD
            self.ala = ALA.from_config(cfg, cid, run, ala_names(self.model, cfg.layer_idx, cfg.ala_layers), head)
        self.train_time: list[float] = []  # seconds of each local training, one entry per round trained
        self.dp = None  # -dp: this client's DP-SGD noise stream and accountant history (plugins/dp_sample.py)
        plugins.setup_client(cfg, self)  # what the plug-ins keep on a client (DP-SGD's accountant)

    # ---- hooks -------------------------------------------------------------------------------------
    def make_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=self.cfg.local_learning_rate)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(x), y)

    def after_backward(self) -> None:
        """Called between ``backward`` and ``optimizer.step`` (gradient corrections)."""

    def batched_step(self, params: dict, grads: dict, lrs: dict) -> dict:
        """``--executor batched``: ``after_backward`` and the SGD step in functional form, on the trained
        entries of a phase (named as in ``dp_modules``, stacked over clients; ``lrs`` broadcast against
        them): p - lr g. An algorithm that overrides ``after_backward`` overrides this too."""
        return sgd_step(params, grads, lrs)

    def dp_modules(self) -> dict[str, nn.Module]:
        """``-dp``'s seam: the modules, by name, whose parameters local training's optimizers step. Every step
        of ``run_epochs`` is then a DP-SGD release (``dp_backward``) of the per-sample gradients of the
        parameters its optimizer trains, computed by swapping per-sample copies into these modules. By default
        the model; an algorithm whose optimizers train other modules names them too (Ditto's personal model,
        APFL's v and α, FML's local model, FedKD's mentor). A trained parameter outside them is refused."""
        return {"model": self.model}

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
        return self.cfg.local_epochs * self.batches_per_epoch()

    def batches_per_epoch(self, batch_size: int | None = None) -> int:
        """How many batches ``batches`` cuts one epoch into."""
        return len(batch_bounds(self.train_count(), batch_size or self.cfg.batch_size, self.merge_single))

    def train_indices(self) -> torch.Tensor | None:
        """The training samples local training draws its batches from (indices), None for all of them.
        An algorithm that holds some back from its update (PartialFed's held-out slice) overrides this
        and ``train_count``; ``batches`` and ``batches_per_epoch`` read them."""
        return None

    def train_count(self) -> int:
        """How many samples one epoch of local training passes over."""
        return self.train_samples

    def dp_epsilon(self, delta: float) -> float:
        """Epsilon (at ``delta``) of this client's DP-SGD steps so far; 0.0 without ``-dp`` or before it
        trains. A method, so the server reaches it through any executor."""
        return 0.0 if self.dp is None else self.dp.epsilon(delta)

    def dp_backward(self, objective, optimizer, x: torch.Tensor, y: torch.Tensor,
                    modules: dict[str, nn.Module] | None = None, noise: torch.Generator | None = None) -> torch.Tensor:
        """``-dp``: set ``.grad`` of every parameter ``optimizer`` trains to the DP-SGD release of the gradient
        of ``objective(x, y)`` on this batch, counted by this client's accountant (at the rate of a batch of
        ``train_count``); returns the batch's mean loss. ``modules`` hold those parameters (default
        ``dp_modules``; a fine-tuned copy names itself); ``noise`` is the stream the noise comes from (default
        the training stream; fine-tuning has its own, so evaluating never shifts training's noise)."""
        return self.dp.backward(self.dp_modules() if modules is None else modules, objective, optimizer, x, y,
                                self.train_count(), noise)

    def eval_model(self) -> nn.Module:
        """The client's personalised model, the one evaluated on its own test split."""
        return self.model

    def new_client_model(self) -> nn.Module:
        """-nnc: the model a client that joins after training fine-tunes and is evaluated on, once it has
        received its payload: the evaluated model, unless that is a personal model the payload never
        reaches (Ditto's v: there the received model, as PFLlib fine-tunes it)."""
        return self.eval_model()

    # ---- state (checkpoints and parking: runtime/state.py) ------------------------------------------
    checkpoint_skip = ()  # attributes a checkpoint leaves out (state an algorithm rebuilds by itself)
    checkpoint_fixed = ("id", "run")  # who the state belongs to: a saved state must hold the same values
    # built from the flags by the constructor: where the fresh client holds None, a saved state holds None too
    checkpoint_built = ("white", "scaler", "ala", "dp", "x_val", "y_val")

    def checkpoint_links(self) -> dict:
        """Objects a saved state refers to rather than holds: the config and the data, rebuilt from the
        flags and the split."""
        return {"cfg": self.cfg, "x_train": self.x_train, "y_train": self.y_train, "x_test": self.x_test,
                "y_test": self.y_test, **({} if self.x_val is None else {"x_val": self.x_val, "y_val": self.y_val})}

    def state_dict(self, skip=()) -> dict:
        """This client's state as tensors and plain values (runtime/state.py): by default every attribute
        but ``checkpoint_skip`` and ``skip`` (model, optimizer, streams, ALA, an algorithm's extras)."""
        links = {id(v): k for k, v in self.checkpoint_links().items()}
        return state.encode_attrs(self, links, (*self.checkpoint_skip, *skip), f"client {self.id}")

    def load_state_dict(self, saved: dict) -> None:
        """Put a ``state_dict`` back onto this client, as built by its constructor."""
        state.decode_attrs(self, saved, self.checkpoint_links(), self.device, f"client {self.id}", self.new_module)

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

    def batches(self, epochs: int, batch_size: int | None = None, generator: torch.Generator | None = None):
        """Index batches for ``epochs`` passes over the training data (``train_indices``), shuffled from this client's stream
        (or from ``generator``, for draws that must not shift it, e.g. evaluation-time fine-tuning).
        The last batch of an epoch may be smaller (every sample is used; PFLlib drops it); for a model with
        BatchNorm a last batch of one sample joins the one before it (utils/batching.py)."""
        bs = batch_size or self.cfg.batch_size
        gen = self.batch_gen if generator is None else generator
        pool = self.train_indices()
        for _ in range(epochs):
            perm = torch.randperm(self.train_samples if pool is None else len(pool), generator=gen).to(self.device)
            yield from batches_of(perm if pool is None else pool[perm], bs, self.merge_single)

    def train(self, round_idx: int = 0) -> None:
        start = time.perf_counter()
        if self.ala is not None:
            self.ala.features = None  # training changes the lower layers they came from
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(round_idx)
        self.local_update(round_idx)
        self.train_time.append(time.perf_counter() - start)

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
        ``generator`` draws the batches from another stream (see ``batches``). ``step(x, y) -> loss``
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
        for idx in self.batches(epochs, batch_size, generator):
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
            loss = self.dp_backward(objective, optimizer, x, y)
        if own:
            self.after_backward()
        if self.scaler is None:
            optimizer.step()
        else:  # skips the step when the fp16 gradients overflowed, then adapts the scale
            self.scaler.step(optimizer)
            self.scaler.update()
        return loss

    # ---- evaluation --------------------------------------------------------------------------------
    @torch.no_grad()
    def test_metrics(self, model: nn.Module | None = None) -> tuple[int, int, float]:
        """(correct, samples, AUC) of the personalised model (or ``model``) on this client's test split."""
        model = self.eval_model() if model is None else model
        was_training = model.training
        with autocast(self.cfg, self.device):
            logits = predict(model, self.x_test, self.cfg.eval_batch_size)
        model.train(was_training)
        self.check_finite(logits, "test")
        correct = int((logits.argmax(1) == self.y_test).sum())
        auc = auc_ovr(torch.softmax(logits.float(), 1).cpu().numpy(), self.y_test.cpu().numpy(), self.num_classes)
        return correct, self.test_samples, auc

    @torch.no_grad()
    def backdoor_metrics(self) -> tuple[int, int]:
        """``--attack backdoor``: (hits, eligible) of the trigger on this client's test split: its test
        images whose label is not the target, and how many of them the personalised model classifies as the
        target once stamped (utils/backdoor.py)."""
        from utils.backdoor import success_counts

        model = self.eval_model()
        was_training = model.training
        with autocast(self.cfg, self.device):
            counts = success_counts(lambda x: predict(model, x, self.cfg.eval_batch_size), self.x_test, self.y_test,
                                    self.cfg.backdoor_target, self.cfg.trigger_size, self.white)
        model.train(was_training)
        return counts

    @torch.no_grad()
    def val_metrics(self) -> tuple[int, int]:
        """(correct, samples) of the personalised model on the validation split (``--val_ratio``)."""
        model = self.eval_model()
        was_training = model.training
        with autocast(self.cfg, self.device):
            logits = predict(model, self.x_val, self.cfg.eval_batch_size)
        model.train(was_training)
        return int((logits.argmax(1) == self.y_val).sum()), len(self.y_val)

    def join_late(self, payload, epochs: int) -> tuple[int, int, float]:
        """-nnc: this client took no part in training. It receives ``payload`` (None: nothing), fine-tunes
        ``new_client_model`` ``epochs`` epochs of plain SGD (cross-entropy, -lr, batch -lbs) on its
        training data, batches drawn from its own "new-client" stream, and returns its ``test_metrics``
        on that model."""
        if payload is not None:
            self.receive(payload, True)
        model = self.new_client_model()
        if epochs:
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=self.cfg.local_learning_rate)
            self.run_epochs(epochs, optimizer=opt, objective=lambda x, y: self.loss_fn(model(x), y),
                            generator=torch_gen(self.cfg.seed, self.run, "new-client", self.id))
        return self.test_metrics(model)

    @torch.no_grad()
    def check_finite(self, logits: torch.Tensor, split: str) -> None:
        """An evaluation of a model whose outputs are NaN or +inf ends the run as diverged (its accuracy would be
        argmax over NaN, a number that means nothing); -inf is a masked class (FedGC's logits of the classes a
        client does not own), not a divergence."""
        if bool(torch.isnan(logits).any() or torch.isposinf(logits).any()):
            raise Diverged(f"client {self.id}: the evaluated model's outputs on its {split} split are not finite; "
                           f"lower -lr (now {self.cfg.local_learning_rate}) or check the model and the data")

    def train_metrics(self) -> tuple[float, int]:
        """(summed cross-entropy, samples) of the personalised model over its whole training split, or
        with ``--train_loss_eval sampled`` its mean over this client's fixed loss sample times its
        sample count (an unbiased estimate of the sum; see ``train_loss_sample``)."""
        model = self.eval_model()
        was_training = model.training
        idx = self.train_loss_sample() if self.cfg.train_loss_eval == "sampled" else None
        x, y = (self.x_train, self.y_train) if idx is None else (self.x_train[idx], self.y_train[idx])
        feats = self.ala.features_for(model) if self.ala is not None else None
        if feats is not None:  # this round's ALA already ran these lower layers on every training sample
            logits = predict(head_of(model), feats if idx is None else feats[idx], self.cfg.eval_batch_size)
        else:
            with autocast(self.cfg, self.device):
                logits = predict(model, x, self.cfg.eval_batch_size)
        model.train(was_training)
        self.check_finite(logits, "training")
        loss = nn.functional.cross_entropy(logits.float(), y, reduction="sum")
        if idx is not None:
            loss = loss * (self.train_samples / len(y))
        return float(loss), self.train_samples

    def train_loss_sample(self) -> torch.Tensor:
        """``--train_loss_eval sampled``: ``--train_loss_fraction`` of this client's training samples (at
        least one), drawn once per run from its own (seed, run, "train-loss", id) stream and kept, so every
        evaluation and every algorithm with the same seed measures the same samples."""
        if self.loss_sample is None:
            k = max(1, math.ceil(self.cfg.train_loss_fraction * self.train_samples))
            gen = torch_gen(self.cfg.seed, self.run, "train-loss", self.id)
            self.loss_sample = torch.randperm(self.train_samples, generator=gen)[:k].sort().values.to(self.device)
        return self.loss_sample


def copy_state(target: nn.Module, source: nn.Module, buffers: bool = True) -> None:
    """Overwrite ``target``'s parameters and (unless ``buffers`` is False: BatchNorm statistics stay the
    target's own) its buffers with ``source``'s, in place."""
    dst = target.state_dict()
    keep = set() if buffers else {k for k, _ in target.named_buffers()}
    with torch.no_grad():
        for k, v in source.state_dict().items():
            if k not in keep:
                dst[k].copy_(v)
