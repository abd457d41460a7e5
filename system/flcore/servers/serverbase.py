"""Server: the one round loop, client selection, aggregation, evaluation and result files.

Round t (0-based, ``-gr`` rounds in all):
    select_clients -> send_models (every client receives the global model; participants run their local
    initialisation, e.g. ALA) -> evaluate (every ``-eg`` rounds, on the models just initialised, as PFLlib
    does) -> train_clients -> receive_models -> aggregate -> after_round.
After the last round the final global model is sent once more and evaluated, so a run of R rounds has
evaluations at rounds 0 (initial model), eg, 2eg, ... and R.

A new algorithm subclasses ``Server`` (setting ``client_class``) and overrides only the hooks it changes.
"""
from __future__ import annotations

import time

import numpy as np
import torch
from tqdm import tqdm

from flcore.clients.clientbase import Client
from flcore.trainmodel.models import build_model
from utils.aggregate import weighted_average
from utils.data_utils import FederatedData
from utils.metrics import summarize
from utils.results import RunRecorder
from utils.seeding import np_rng, torch_seeded


class Server:
    client_class = Client

    @classmethod
    def add_args(cls, parser) -> None:
        """Add this algorithm's own flags to ``parser`` (defaults from its paper)."""

    @classmethod
    def check_config(cls, cfg) -> None:
        """Reject flag combinations this algorithm cannot honour (raise FLError with one clear line)."""

    def __init__(self, cfg, data: FederatedData, run: int = 0, recorder: RunRecorder | None = None):
        self.cfg, self.data, self.run = cfg, data, run
        self.device = torch.device(cfg.device)
        with torch_seeded(cfg.seed, run, "model"):
            self.global_model = self.build_model().to(self.device)
        self.clients = [self.make_client(i) for i in range(len(data.clients))]
        # Independent streams: an algorithm's own draws never change who is selected or dropped.
        self.select_rng = np_rng(cfg.seed, run, "select")
        self.drop_rng = np_rng(cfg.seed, run, "drop")
        self.recorder = recorder
        if self.clients and self.clients[0].ala is not None:
            names = self.clients[0].ala.names
            print(f"ALA adapts {len(names)} tensor(s) (top {cfg.layer_idx or 'all'} layer(s)): {', '.join(names)}")
        self.selected: list[Client] = []
        self.round_idx = 0

    def build_model(self) -> torch.nn.Module:
        return build_model(self.cfg.model, self.data.input_shape, self.data.num_classes,
                           self.cfg.feature_dim, self.cfg.vocab_size)

    def make_client(self, cid: int) -> Client:
        with torch_seeded(self.cfg.seed, self.run, "client-init", cid):
            return self.client_class(self.cfg, cid, self.data.clients[cid], self.global_model, self.run)

    # ---- hooks -------------------------------------------------------------------------------------
    def select_clients(self) -> list[Client]:
        """``-jr`` of the clients, drawn without replacement from the selection stream; with ``-rjr`` the
        count itself is drawn uniformly from [jr*N, N] each round (PFLlib's random join ratio)."""
        n = len(self.clients)
        k = max(1, int(round(self.cfg.join_ratio * n)))
        if self.cfg.random_join_ratio:
            k = int(self.select_rng.integers(k, n + 1))
        ids = np.sort(self.select_rng.choice(n, size=k, replace=False))
        return [self.clients[i] for i in ids]

    def send_models(self, participants: list[Client]) -> None:
        chosen = {c.id for c in participants}
        for c in self.clients:
            c.receive_global(self.global_model, participating=c.id in chosen)

    def active_clients(self, participants: list[Client]) -> list[Client]:
        """Participants that do not drop out this round (``-cdr``): each drops independently with that
        probability, drawn from the drop stream; dropped clients neither train nor upload."""
        if self.cfg.client_drop_rate <= 0:
            return participants
        keep = self.drop_rng.random(len(participants)) >= self.cfg.client_drop_rate
        return [c for c, k in zip(participants, keep) if k]

    def train_clients(self, clients: list[Client]) -> None:
        for c in clients:
            c.train(self.round_idx)

    def receive_models(self, clients: list[Client]) -> list[dict]:
        return [c.upload() for c in clients]

    def aggregate(self, uploads: list[dict]) -> None:
        """Sample-weighted FedAvg over every floating state entry (BatchNorm statistics included)."""
        if not uploads:
            return
        avg = weighted_average([u["state"] for u in uploads], [u["weight"] for u in uploads])
        self.global_model.load_state_dict(avg)

    def after_round(self) -> None:
        """Called at the end of every round (DLG, checkpoints and similar add-ons hook in here)."""

    # ---- evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        tests = np.array([c.test_metrics() for c in self.clients], dtype=np.float64)
        if self.cfg.train_loss_eval == "off":
            trains = np.zeros((len(self.clients), 2))
        else:
            trains = np.array([c.train_metrics() for c in self.clients], dtype=np.float64)
        summary = summarize(tests[:, 0], tests[:, 1], tests[:, 2], trains[:, 0], trains[:, 1])
        summary.update(self.extra_metrics())
        return summary

    def extra_metrics(self) -> dict:
        """Further per-evaluation series an algorithm records (e.g. Ditto's global-model accuracy)."""
        return {}

    def record(self, summary: dict) -> None:
        tqdm.write(f"round {self.round_idx:4d} | acc {summary['test_acc']:.4f} "
                   f"(clients {summary['test_acc_mean']:.4f} ± {summary['test_acc_std']:.4f}) | "
                   f"auc {summary['test_auc']:.4f} | train loss {summary['train_loss']:.4f}")
        if self.recorder is not None:
            self.recorder.add(self.round_idx, summary)
            self.recorder.save()

    def should_stop(self) -> bool:
        """``-ab``: stop once the best accuracy is more than ``-tc`` evaluations old."""
        if not self.cfg.auto_break or self.recorder is None:
            return False
        acc = self.recorder.series.get("rs_test_acc", [])
        return len(acc) - 1 - int(np.argmax(acc)) > self.cfg.top_cnt

    # ---- the loop ----------------------------------------------------------------------------------
    def train(self) -> None:
        cfg = self.cfg
        for t in tqdm(range(cfg.global_rounds), desc=f"{cfg.algorithm} run {self.run}", leave=False,
                      disable=not cfg.progress):
            self.round_idx = t
            start = time.perf_counter()
            self.selected = self.select_clients()
            self.send_models(self.selected)
            if t % cfg.eval_gap == 0:
                self.record(self.evaluate())
            active = self.active_clients(self.selected)
            self.train_clients(active)
            self.aggregate(self.receive_models(active))
            self.after_round()
            if self.recorder is not None:
                self.recorder.round_time.append(time.perf_counter() - start)
            if self.should_stop():
                break
        self.round_idx += 1
        self.send_models(self.clients)
        self.record(self.evaluate())
