"""CUDA graphs for the batched executor (runtime/stacked.py): a stacked step captured once and replayed.

At batch 10 a training step of the 4-layer CNN is a few hundred small kernels, whose launches cost more than
their work on a GPU; replaying a captured graph launches them as one. A graph replays fixed memory, so the
step runs on fixed buffers that each computation of the same key loads its stacked entries into, and over
every client of the stack, the clients without a full batch at that step masked.
"""
from __future__ import annotations

import collections

import torch


class CudaGraphs:
    """The full-size step of a stacked computation (a training phase's SGD step, an ALA epoch's W step)
    captured as a CUDA graph once per (key, clients) and replayed every step and every round after: at batch
    10 a step is a few hundred small kernels, whose launches cost more than their work. The captured step runs
    over every client of the stack; a row without a full batch at that step is masked (``torch.where`` keeps
    its entries). The graph reads and writes fixed buffers, which every computation of that key loads its
    stacked entries into. Only on CUDA (the executor never builds this on a CPU); ``capture=False`` runs the
    same masked step on the same fixed buffers without a graph (how the CPU tests check it)."""

    def __init__(self, size: int = 8, capture: bool = True):
        self.cache: collections.OrderedDict = collections.OrderedDict()
        self.size, self.capture = size, capture
        self.broken = ""

    def get(self, key: tuple, buffers: dict, step, x: torch.Tensor, y: torch.Tensor):
        """The graph of ``key``, its buffers loaded from ``buffers`` (the caller then works on
        ``graph.buffers``); None once capture has failed in this run. ``step(buffers, x, y, mask)`` is the
        masked step; ``x``, ``y``: a full step's inputs (their shapes)."""
        if self.broken:
            return None
        entry = self.cache.get(key)
        if entry is None:
            try:
                entry = StepGraph(buffers, step, x, y, self.capture)
            except Exception as e:  # noqa: BLE001  (capture is not possible here: the eager steps, said once)
                self.broken = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"note: CUDA graphs off for this run ({self.broken}); the batched steps run eagerly")
                return None
            self.cache[key] = entry
            while len(self.cache) > self.size:
                self.cache.popitem(last=False)
        else:
            entry.load(buffers)
            self.cache.move_to_end(key)
        return entry


def _clone_tree(tree):
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: _clone_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_clone_tree(v) for v in tree)
    return tree


def _copy_tree(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, dict):
        for k in dst:
            _copy_tree(dst[k], src[k])
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            _copy_tree(d, s)


def row_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` (one flag per row) shaped to broadcast against a stacked entry."""
    return mask.view(-1, *[1] * (like.dim() - 1))


class StepGraph:
    """One captured step and the fixed buffers it works on: ``buffers`` (a tree of stacked tensors), the
    step's inputs ``x``, ``y`` and its row ``mask``."""

    def __init__(self, buffers: dict, step, x: torch.Tensor, y: torch.Tensor, capture: bool):
        self.buffers = _clone_tree(buffers)
        self.x, self.y = x.clone(), y.clone()
        self.mask = torch.zeros(len(x), dtype=torch.bool, device=x.device)

        def run():
            with torch.enable_grad():
                step(self.buffers, self.x, self.y, self.mask)

        self.run, self.graph = run, None
        if not capture:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up with every row masked: nothing moves
                run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            run()

    def load(self, buffers: dict) -> None:
        _copy_tree(self.buffers, buffers)

    def replay(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> None:
        self.x.copy_(x)
        self.y.copy_(y)
        self.mask.copy_(mask)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.run()
