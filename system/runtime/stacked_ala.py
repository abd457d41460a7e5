"""ALA's weight learning for several clients at once (the batched executor's third computation; ALA
itself: utils/ALA.py). One ``ALA._epoch`` of every client that hands one over runs as one stacked
computation, step i updating every client's W on its batch i (runtime/stacked.py's ``Schedule``)."""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from runtime.graphs import row_mask
from runtime.stacked import Schedule, concat_offsets, select_tree, signature, write_rows
from utils.batching import batches_of


class ALAEpoch:
    """One epoch of ALA's W updates (``ALA._epoch``) for several clients at once: W, Θ_i and Θ of the
    adapted tensors stacked, the frozen lower layers stacked unless every client holds the same tensors
    (then shared). Returns each client's mean batch loss; each ALA's ``weights`` are replaced."""

    def __init__(self, requests: list, graphs=None):
        self.requests, self.graphs = requests, graphs
        ala0, fwd0 = requests[0][0], requests[0][1]
        self.names, self.eta, self.cut, self.module = list(ala0.names), ala0.eta, fwd0.cut, fwd0.module
        inputs = [r[4] for r in requests]
        self.x = torch.cat(inputs) if len(inputs) > 1 else inputs[0]
        self.y = torch.cat([r[5] for r in requests]) if len(requests) > 1 else requests[0][5]
        device = self.y.device
        batches = []
        for ala, _, _, _, _, ys, merge in requests:
            perm = torch.randperm(len(ys), generator=ala.generator).to(ys.device)
            batches.append(list(batches_of(perm, ala.batch_size, merge)))
        self.schedule = Schedule(batches, concat_offsets(inputs), ala0.batch_size, device)
        order = [requests[c] for c in self.schedule.order]
        self.order = order
        self.w = {k: torch.stack([r[0].weights[k].detach() for r in order]) for k in self.names}
        self.local = {k: torch.stack([r[2][k] for r in order]) for k in self.names}
        self.glob = {k: torch.stack([r[3][k] for r in order]) for k in self.names}
        frozen0 = fwd0.frozen
        self.shared = all(r[1].frozen.keys() == frozen0.keys() and all(r[1].frozen[n] is frozen0[n] for n in frozen0)
                          for r in order)
        self.frozen = frozen0 if self.shared else {n: torch.stack([r[1].frozen[n] for r in order]) for n in frozen0}
        self.losses: torch.Tensor | None = None  # [step, row], filled by ``run``
        self.vg = vmap(grad_and_value(self.loss), in_dims=(0, 0, 0, None if self.shared else 0, 0, 0))

    def loss(self, w, local, glob, frozen, x, y):
        from utils.ALA import combine

        top = {k[self.cut:]: combine(local[k], glob[k], w[k]) for k in self.names}
        return nn.functional.cross_entropy(functional_call(self.module, {**frozen, **top}, (x,)), y)

    def masked_step(self, b: dict, x, y, mask) -> None:
        """The W step a CUDA graph captures: every row, those not in ``mask`` left as they are."""
        from utils.ALA import weight_step

        grads, loss = self.vg(b["w"], b["local"], b["glob"], b["frozen"], x, y)
        for k, w in b["w"].items():
            w.copy_(torch.where(row_mask(mask, w), weight_step(w, grads[k], self.eta), w))
        b["loss"].copy_(loss.detach())

    def use_graph(self):
        s = self.schedule
        if self.graphs is None or s.length == 0:
            return None
        buffers = {"w": self.w, "local": self.local, "glob": self.glob, "frozen": self.frozen,
                   "loss": torch.zeros(s.n, device=self.y.device)}
        graph = self.graphs.get((ala_key(self.requests[0]), self.shared, s.n), buffers, self.masked_step,
                                self.x[s.index[0]], self.y[s.index[0]])
        if graph is not None:
            b = graph.buffers
            self.w, self.local, self.glob, self.frozen = b["w"], b["local"], b["glob"], b["frozen"]
        return graph

    def step(self, i: int, rows, x, y) -> None:
        """Step ``i`` of the rows ``rows`` (their batches ``x``, ``y``): W moves, the loss is kept."""
        from utils.ALA import weight_step

        w = {k: t[rows] for k, t in self.w.items()}
        frozen = self.frozen if self.shared else select_tree(self.frozen, rows)
        grads, loss = self.vg(w, select_tree(self.local, rows), select_tree(self.glob, rows), frozen, x, y)
        for k in self.names:
            write_rows(self.w[k], rows, weight_step(w[k], grads[k], self.eta))
        if isinstance(rows, slice):
            self.losses[i, rows] = loss.detach()
        else:
            self.losses[i].index_copy_(0, rows, loss.detach())

    def run(self) -> list[float]:
        s = self.schedule
        self.losses = losses = torch.zeros(s.length, s.n, device=self.y.device)
        graph = self.use_graph()

        def replayed(i: int) -> None:
            losses[i] = torch.where(s.full_mask[i], graph.buffers["loss"], losses[i])

        s.walk(self.x, self.y, self.step, graph, replayed)
        table = losses.t().tolist()
        out = [None] * len(self.order)
        for r, req in enumerate(self.order):
            req[0].weights = {k: self.w[k][r].clone() for k in self.names}
            total = 0.0
            for v in table[r][:s.count[r]]:
                total += v  # summed as Python floats in step order, as ALA._epoch sums them
            out[s.order[r]] = total / max(s.count[r], 1)
        return out


def ala_key(request) -> tuple:
    ala, fwd, _, _, inputs, _, merge = request
    return ("ala", signature(fwd.module), fwd.cut, tuple(ala.names), tuple(inputs.shape[1:]), inputs.dtype,
            ala.batch_size, ala.eta, merge, tuple(sorted(fwd.frozen)))
