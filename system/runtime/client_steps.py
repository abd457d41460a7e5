"""What the engine runs on a client, where the client lives (``server.call_clients(clients, fn, ...)`` runs
``fn(client, ...)`` in the client's process: runtime/executors.py ``call``): a round's local training and
the evaluations. They call the client's hooks (``local_update``, ``eval_model``, ``receive``,
``run_epochs``), read its declaration (``declares.new_client_model``) and are no part of a client's class, so an algorithm neither sees nor
overrides them.
"""
from __future__ import annotations

import math
import time

import torch
from torch import nn

from utils.amp import autocast
from utils.errors import Diverged
from utils.metrics import auc_ovr, predict
from utils.seeding import torch_gen


def train(client, round_idx: int = 0) -> None:
    """One round of local training: the round's rate (``learning_rate``) into the client's optimizer, then
    its ``local_update``, timed (``train_time``: one entry per round trained)."""
    start = time.perf_counter()
    if client.ala is not None:
        client.ala.features = None  # training changes the lower layers they came from
    client.model.train()
    for group in client.optimizer.param_groups:
        group["lr"] = client.learning_rate(round_idx)
    client.local_update(round_idx)
    client.train_time.append(time.perf_counter() - start)


@torch.no_grad()
def test_metrics(client, model: nn.Module | None = None) -> tuple[int, int, float]:
    """(correct, samples, AUC) of the client's personalised model (``eval_model``, or ``model``) on its test
    split."""
    model = client.eval_model() if model is None else model
    was_training = model.training
    with autocast(client.cfg, client.device):
        logits = predict(model, client.x_test, client.cfg.eval_batch_size)
    model.train(was_training)
    check_finite(client, logits, "test")
    correct = int((logits.argmax(1) == client.y_test).sum())
    auc = auc_ovr(torch.softmax(logits.float(), 1).cpu().numpy(), client.y_test.cpu().numpy(), client.num_classes)
    return correct, client.test_samples, auc


@torch.no_grad()
def val_metrics(client) -> tuple[int, int]:
    """(correct, samples) of the personalised model on the validation split (``--val_ratio``)."""
    model = client.eval_model()
    was_training = model.training
    with autocast(client.cfg, client.device):
        logits = predict(model, client.x_val, client.cfg.eval_batch_size)
    model.train(was_training)
    return int((logits.argmax(1) == client.y_val).sum()), len(client.y_val)


def train_metrics(client) -> tuple[float, int]:
    """(summed cross-entropy, samples) of the personalised model over the client's whole training split, or
    with ``--train_loss_eval sampled`` its mean over the client's fixed loss sample times its sample count
    (an unbiased estimate of the sum; see ``train_loss_sample``)."""
    model = client.eval_model()
    was_training = model.training
    idx = train_loss_sample(client) if client.cfg.train_loss_eval == "sampled" else None
    x, y = (client.x_train, client.y_train) if idx is None else (client.x_train[idx], client.y_train[idx])
    feats = client.ala.features_for(model) if client.ala is not None else None
    if feats is not None:  # this round's ALA already ran these lower layers on every training sample
        head = getattr(model, client.ala.head)  # the classifier, whose inputs ALA kept
        logits = predict(head, feats if idx is None else feats[idx], client.cfg.eval_batch_size)
    else:
        with autocast(client.cfg, client.device):
            logits = predict(model, x, client.cfg.eval_batch_size)
    model.train(was_training)
    check_finite(client, logits, "training")
    loss = nn.functional.cross_entropy(logits.float(), y, reduction="sum")
    if idx is not None:
        loss = loss * (client.train_samples / len(y))
    return float(loss), client.train_samples


def train_loss_sample(client) -> torch.Tensor:
    """``--train_loss_eval sampled``: ``--train_loss_fraction`` of the client's training samples (at least
    one), drawn once per run from its own (seed, run, "train-loss", id) stream and kept (``loss_sample``), so
    every evaluation and every algorithm with the same seed measures the same samples."""
    if client.loss_sample is None:
        k = max(1, math.ceil(client.cfg.train_loss_fraction * client.train_samples))
        gen = torch_gen(client.cfg.seed, client.run, "train-loss", client.id)
        client.loss_sample = torch.randperm(client.train_samples, generator=gen)[:k].sort().values.to(client.device)
    return client.loss_sample


@torch.no_grad()
def check_finite(client, logits: torch.Tensor, split: str) -> None:
    """An evaluation of a model whose outputs are NaN or +inf ends the run as diverged (its accuracy would be
    argmax over NaN, a number that means nothing); -inf is a masked class (FedGC's logits of the classes a
    client does not own), not a divergence."""
    if bool(torch.isnan(logits).any() or torch.isposinf(logits).any()):
        raise Diverged(f"client {client.id}: the evaluated model's outputs on its {split} split are not finite; "
                       f"lower -lr (now {client.cfg.local_learning_rate}) or check the model and the data")


def join_late(client, payload, epochs: int) -> tuple[int, int, float]:
    """-nnc: the client took no part in training. It receives ``payload`` (None: nothing), fine-tunes its
    declared ``new_client_model`` (None: its ``eval_model``) ``epochs`` epochs of plain SGD (cross-entropy, -lr, batch -lbs) on its training
    data, batches drawn from its own "new-client" stream, and returns its ``test_metrics`` on that model."""
    if payload is not None:
        client.receive(payload, True)
    name = client.declares.new_client_model
    model = client.eval_model() if name is None else getattr(client, name)
    if epochs:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=client.cfg.local_learning_rate)
        client.run_epochs(epochs, optimizer=opt, objective=lambda x, y: client.loss_fn(model(x), y),
                          generator=torch_gen(client.cfg.seed, client.run, "new-client", client.id))
    return test_metrics(client, model)
