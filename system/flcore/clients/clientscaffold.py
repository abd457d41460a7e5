"""SCAFFOLD client: every gradient corrected by c - c_i; c_i updated by option II (see servers/serverscaffold.py)."""
import torch

from flcore.clients.clientbase import Client, Upload


class SCAFFOLDClient(Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.c_i = {k: torch.zeros_like(p) for k, p in self.model.named_parameters()}  # client control variate
        self.c = self.c_i  # the server's, as last received
        self.next_c_i = None  # c_i+, committed when the upload carries its change to the server

    def receive(self, payload, participating=True):
        super().receive(payload["model"], participating)
        self.c = payload["c"]

    def after_backward(self):
        for k, p in self.model.named_parameters():  # g - c_i + c
            if p.grad is not None:
                p.grad += self.c[k] - self.c_i[k]

    def local_update(self, round_idx):
        start = {k: p.detach().clone() for k, p in self.model.named_parameters()}  # x (y_i at step 0)
        super().local_update(round_idx)
        k_lr = self.steps_per_round() * self.learning_rate(round_idx)  # K η_l, K the real step count
        self.next_c_i = {k: self.c_i[k] - self.c[k] + (start[k] - p.detach()) / k_lr
                         for k, p in self.model.named_parameters()}  # option II

    def upload(self):
        dc = {k: self.next_c_i[k] - self.c_i[k] for k in self.c_i}
        self.c_i, self.next_c_i = self.next_c_i, None
        return Upload(self.id, self.train_samples, self.model.state_dict(), extras={"dc": dc})
