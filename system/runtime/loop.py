"""The round loop: every round of a run, and what happens after the last one. It drives a server
(flcore/servers/serverbase.py) through the hooks its algorithm overrides and never names an algorithm or
a plug-in.

Round t (0-based, ``-gr`` rounds in all), ``run_round(server, t)``:
    select_clients -> send (``prepare_broadcast``, then ``broadcast(client)`` decides each client's payload,
    by default the global model; ``client.receive(payload, participating)`` runs its local initialisation,
    e.g. ALA) -> evaluate (every ``-eg`` rounds, on the models just initialised, as PFLlib does) -> train
    the active clients -> their ``upload()`` (an ``Upload``) -> ``aggregate`` -> ``after_round``.
After the last round the final global model is sent once more (to a selection drawn as for a round) and
evaluated, so a run of R rounds has evaluations at rounds 0 (initial model), eg, 2eg, ... and R, all by
one rule: every client receives the broadcast; the selected ones run their local initialisation (ALA, with
``--ala_clients all`` every client does), and each client's own model is evaluated. The cross-cutting features
(attacks, robust aggregation, server optimizers, DP, the DLG monitor: plugins/) act at the round's named
points: the loop calls every plug-in the flags turn on (``server.plugins``) without naming any.

Each step of a round runs inside the server's ``timer`` (a ``PhaseTimer``, the loop's one seam for timing:
scripts/run/benchmark.py), which by default does nothing.

Fault tolerance, checkpoints and resume: runtime/checkpoint.py; simulated slow clients: runtime/faults.py.
"""
from __future__ import annotations

import contextlib
import itertools
import time

import numpy as np
from tqdm import tqdm

from runtime import client_steps
from runtime.executors import WorkerLost
from utils.comm import payload_bytes
from utils.errors import Diverged, FLError
from utils.metrics import summarize
from utils.results import raise_if_stopped


class PhaseTimer:
    """The loop's seam for timing a run (``server.timer``; scripts/run/benchmark.py times each phase with
    it). Each step of a round, and the final evaluation's two, runs inside ``phase(server, name, clients)``:
    ``name`` one of ``PHASES``, ``clients`` those the step acts on (send: the round's selection; evaluate:
    every client; train, receive and aggregate: the active ones). Every evaluation, once recorded, passes
    ``recorded(server, summary)``; every round ends with ``round_done(server)``, after ``after_round`` and
    the plug-ins'. This default does nothing; the numbers of a run never depend on its timer."""

    def phase(self, server, name: str, clients: list):
        return contextlib.nullcontext()

    def recorded(self, server, summary: dict) -> None:
        pass

    def round_done(self, server) -> None:
        pass


PHASES = ("send", "evaluate", "train", "receive", "aggregate")


def train(server) -> None:
    """Run every round of ``server``'s run. ``--resume`` continues from the run's checkpoint. A lost worker
    sends the run back to its last checkpoint (round 0 without ``--checkpoint_every``) and the rounds are
    replayed: every draw is seeded, so the numbers are those of an undisturbed run."""
    first = server.checkpoints.begin(server)
    for restarts in itertools.count():
        try:
            return run_rounds(server, first)
        except WorkerLost as e:
            if restarts >= server.cfg.max_restarts:
                raise FLError(f"{e}, {restarts + 1} time(s) in this run (--max_restarts "
                              f"{server.cfg.max_restarts}); results so far are kept; rerun with --resume to "
                              f"continue from the last checkpoint") from None
            server.clients = server.executor.reset()
            first = server.checkpoints.recover(server, e)


def run_rounds(server, first: int) -> None:
    """Rounds ``first`` .. ``-gr``-1, then the final evaluation (of round ``-gr``, or of the round ``-ab``
    stopped before; ``-gr 0`` evaluates the initial model as round 0). A signal ends the run by the next
    of these at the latest (``raise_if_stopped``)."""
    cfg = server.cfg
    done = first
    for t in tqdm(range(first, cfg.global_rounds), desc=f"{cfg.algorithm} run {server.run}", leave=False,
                  disable=not cfg.progress, initial=first, total=cfg.global_rounds):
        raise_if_stopped()  # a signal whose KeyboardInterrupt a finalizer swallowed
        if should_stop(server):  # checked before a round, so a resumed run stops where it stopped
            break
        run_round(server, t)
        done = t + 1
    raise_if_stopped()
    final_evaluation(server, done)


def run_round(server, t: int) -> None:
    """Round ``t``: broadcast, evaluation every ``-eg`` rounds, local training, upload, aggregation,
    ``after_round``, then its wall time and (with ``--checkpoint_every``) a checkpoint."""
    cfg = server.cfg
    server.round_idx = t
    start = time.perf_counter()
    server.bytes_down = server.bytes_up = 0
    timer = server.timer
    server.selected = server.select_clients()
    with timer.phase(server, "send", server.selected):
        send(server, server.selected)
    if t % cfg.eval_gap == 0:
        with timer.phase(server, "evaluate", server.clients):
            summary = evaluate(server)
        record(server, summary)
    active = active_clients(server, server.selected)
    for p in server.plugins:  # -dlg: the attacked clients' start models
        p.before_training(server, active)
    with timer.phase(server, "train", active):
        train_clients(server, active)
    with timer.phase(server, "receive", active):
        uploads = receive(server, active)
    for p in server.plugins:  # --attack poisons the malicious uploads; -dlg attacks what they upload
        uploads = p.on_uploads(server, active, uploads)
    with timer.phase(server, "aggregate", active):
        aggregate(server, uploads)
    server.after_round()
    for p in server.plugins:
        p.after_round(server)
    timer.round_done(server)
    if server.recorder is not None:
        server.recorder.round_time.append(time.perf_counter() - start)
        server.recorder.round_bytes["up"].append(server.bytes_up)
        server.recorder.round_bytes["down"].append(server.bytes_down)
    if cfg.checkpoint_every and ((t + 1) % cfg.checkpoint_every == 0 or t + 1 == cfg.global_rounds):
        server.checkpoints.save(server, t)


def send(server, participants: list) -> None:
    """Every client receives its payload; ``participants`` (the round's selection) are told they train."""
    server.prepare_broadcast(participants)
    chosen = {c.id for c in participants}
    calls, sizes = [], {}
    for c in server.clients:
        payload = server.broadcast(c)
        if payload is not None:
            calls.append((c, (payload, c.id in chosen)))
            if id(payload) not in sizes:
                sizes[id(payload)] = payload_bytes(payload)
            server.bytes_down += sizes[id(payload)]
    for p in server.plugins:
        p.on_broadcast(server, [args[0] for _, args in calls])
    server.call_each("receive", calls)


def active_clients(server, participants: list) -> list:
    """Participants that do not drop out this round (``-cdr``): each drops independently with that
    probability, drawn from the drop stream; dropped clients neither train nor upload."""
    if server.cfg.client_drop_rate <= 0:
        return participants
    keep = server.drop_rng.random(len(participants)) >= server.cfg.client_drop_rate
    return [c for c, k in zip(participants, keep) if k]


def train_clients(server, clients: list) -> None:
    """The single dispatch point of local training (one after the other, or in parallel in workers)."""
    server.call_clients(clients, client_steps.train, server.round_idx)


def receive(server, clients: list) -> list:
    """Uploads of the clients that finish within ``-tth`` (simulated slow clients, runtime/faults.py)."""
    late = server.slow.late([c.id for c in clients], server.round_idx)
    server.late = sorted(late)
    uploads = server.call_clients([c for c in clients if c.id not in late], "upload")
    server.bytes_up += sum(payload_bytes(u) for u in uploads)
    return uploads


def aggregate(server, uploads: list) -> None:
    """The round's aggregation step: the algorithm's ``aggregate``, wrapped by the plug-ins'
    ``wrap_aggregate`` (DP-FedAvg with ``--dp_level client``). Where a plug-in acts on
    ``average_uploads`` (``averages``: a robust rule, a server optimizer), the algorithm's ``aggregate``
    must have gone through it."""
    server.averaged = False
    step = server.aggregate
    for p in reversed(server.plugins):  # the first plug-in's wrapper is the outermost
        step = p.wrap_aggregate(server, step)
    step(uploads)
    if uploads and not server.averaged and any(p.averages for p in server.plugins):
        raise FLError(f"--server_opt / --aggregator: {server.cfg.algorithm}'s aggregate does not go through "
                      f"average_uploads; it must declare averaging_refusal")


# ---- evaluation --------------------------------------------------------------------------------------
def evaluate(server) -> dict:
    """Every client's ``test_metrics`` (and ``train_metrics``, ``val_metrics``: runtime/client_steps.py) summarised: the
    sample-weighted accuracy, the clients' mean, std and worst, AUC, train loss, the plug-ins' figures and
    the algorithm's ``extra_metrics``."""
    cfg = server.cfg
    train_loss = cfg.train_loss_eval != "off"
    tests = server.call_clients(server.clients, client_steps.test_metrics)
    trains = server.call_clients(server.clients, client_steps.train_metrics) if train_loss else None
    tests = np.array(tests, dtype=np.float64)
    trains = np.array(trains, dtype=np.float64) if train_loss else np.zeros((len(server.clients), 2))
    summary = summarize(tests[:, 0], tests[:, 1], tests[:, 2], trains[:, 0], trains[:, 1])
    if train_loss and not np.isfinite(summary["train_loss"]):  # as a non-finite training loss does
        raise Diverged(f"round {server.round_idx}: the evaluated train loss is {summary['train_loss']}; lower -lr "
                       f"(now {cfg.local_learning_rate}) or check the model and the data")
    for p in server.plugins:  # the benign clients' summary (--attack), DP epsilon (-dp), ...
        summary.update(p.metrics(server, tests, trains))
    if cfg.val_ratio > 0:  # sample-weighted, as test_acc
        correct, n = np.array(server.call_clients(server.clients, client_steps.val_metrics), dtype=np.float64).sum(0)
        summary["val_acc"] = float(correct / n)
    summary.update(server.extra_metrics())
    return summary


def record(server, summary: dict) -> None:
    """Print one evaluation's line and add it to the run's recorder (saved at once)."""
    loss = "" if server.cfg.train_loss_eval == "off" else f" | train loss {summary['train_loss']:.4f}"
    val = f" | val acc {summary['val_acc']:.4f}" if "val_acc" in summary else ""
    words = [p.describe(summary) for p in server.plugins]  # the plug-ins' own figures (benign acc, epsilon)
    before, after = "".join(w[0] for w in words), "".join(w[1] for w in words)
    tqdm.write(f"round {server.round_idx:4d} | {before}acc {summary['test_acc']:.4f} "
               f"(clients {summary['test_acc_mean']:.4f} ± {summary['test_acc_std']:.4f}, worst "
               f"{summary['test_acc_min']:.4f}){val} | auc {summary['test_auc']:.4f}{loss}{after}")
    if server.recorder is not None:
        server.recorder.add(server.round_idx, summary)
        server.recorder.save()
    server.timer.recorded(server, summary)


def should_stop(server) -> bool:
    """``-ab``: stop once the best accuracy is more than ``-tc`` evaluations old."""
    if not server.cfg.auto_break or server.recorder is None:
        return False
    acc = server.recorder.series.get("rs_test_acc", [])
    if not acc:  # before the first evaluation (round 0) there is nothing to compare
        return False
    return len(acc) - 1 - int(np.argmax(acc)) > server.cfg.top_cnt


def final_evaluation(server, round_idx: int) -> None:
    """After the last round, the final global model is evaluated by the rule of every other evaluation:
    as the first half of one more round (selection, broadcast, evaluation), without training. With
    ``-jr`` < 1 the selected clients initialise from it (ALA) and the others are evaluated on their own
    current model, as in every round (``--ala_clients all``: every client runs ALA, as in PFLlib)."""
    server.round_idx = round_idx
    server.selected = server.select_clients()
    with server.timer.phase(server, "send", server.selected):
        send(server, server.selected)
    with server.timer.phase(server, "evaluate", server.clients):
        summary = evaluate(server)
    record(server, summary)
    if server.data.new_clients:
        evaluate_new_clients(server)


def evaluate_new_clients(server) -> dict:
    """-nnc: every client held out of training is built here (ids after the trained ones, in this process,
    from the common initial model: ``server.new_clients``), receives ``new_client_payload``, fine-tunes
    ``-ften`` epochs and is evaluated on its test split (``client_steps.join_late``). Recorded once, at the final
    round, as the ``new`` series (``rs_new_test_acc``, ``rs_new_client_test_acc``, ...); returns that
    summary."""
    cfg = server.cfg
    tests = []
    for i, d in enumerate(server.data.new_clients):
        client = server.new_clients(len(server.clients) + i, d)
        tests.append(client_steps.join_late(client, server.new_client_payload(client), cfg.fine_tuning_epoch_new))
    tests = np.array(tests, dtype=np.float64)
    none = np.zeros(len(tests))
    summary = summarize(tests[:, 0], tests[:, 1], tests[:, 2], none, none)
    tqdm.write(f"new clients ({len(tests)}, {cfg.fine_tuning_epoch_new} fine-tuning epoch(s)) | acc "
               f"{summary['test_acc']:.4f} (clients {summary['test_acc_mean']:.4f} ± "
               f"{summary['test_acc_std']:.4f}, worst {summary['test_acc_min']:.4f}) | auc {summary['test_auc']:.4f}")
    summary.pop("train_loss")
    if server.recorder is not None:
        server.recorder.add_series("new", server.round_idx, summary)
        server.recorder.save()
    return summary


def close(server) -> None:
    """Release the server's executor's workers (main.py closes the executor it shares between runs)."""
    server.executor.close()
