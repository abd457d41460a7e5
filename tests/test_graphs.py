"""runtime/graphs.py, the CUDA graphs of the batched executor, on a machine without CUDA: the cache of
captured steps, the trees of buffers, the fall-back when capture fails, and the capture recipe itself
against a stand-in for ``torch.cuda`` that records what is called (the real capture runs in the device
script, scripts/experiments/gpu_batched.sh)."""
from __future__ import annotations

import contextlib

import pytest
import torch

from runtime import graphs


def step_inputs():
    return {"w": torch.zeros(2, 3)}, torch.zeros(2, 4), torch.zeros(2, dtype=torch.long)


def test_the_cache_keeps_the_eight_steps_used_last(monkeypatch):
    """Eight graphs (the default), the least recently used one dropped when a ninth is made; using one
    moves it to the end, and loads the caller's buffers into it."""
    made, real = [], graphs.StepGraph
    monkeypatch.setattr(graphs, "StepGraph", lambda *args: made.append(args[0]) or real(*args))
    cache = graphs.CudaGraphs(capture=False)
    buffers, x, y = step_inputs()
    for key in range(8):
        cache.get(key, buffers, None, x, y)
    entry = cache.get(0, {"w": torch.full((2, 3), 5.0)}, None, x, y)
    assert torch.equal(entry.buffers["w"], torch.full((2, 3), 5.0)) and len(made) == 8
    cache.get(8, buffers, None, x, y)
    assert list(cache.cache) == [2, 3, 4, 5, 6, 7, 0, 8] and len(made) == 9


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the capture succeeds")
def test_by_default_the_graphs_capture_and_without_cuda_say_once_they_are_off(capsys):
    try:
        torch.cuda.Stream()
    except Exception as e:  # noqa: BLE001  (what torch says without CUDA, its first line)
        first = str(e).splitlines()[0]
    cache = graphs.CudaGraphs()
    buffers, x, y = step_inputs()
    assert cache.get("k", buffers, None, x, y) is None and cache.get("k", buffers, None, x, y) is None
    assert cache.broken == first and not cache.cache
    assert capsys.readouterr().out == f"note: CUDA graphs off for this run ({first}); the batched steps run eagerly\n"


@pytest.mark.parametrize("message, said", [("first line\nsecond line", "first line"), ("", "RuntimeError")])
def test_a_failed_capture_is_said_by_its_first_line_or_its_type(monkeypatch, message, said):
    def fail(*args):
        raise RuntimeError(message)

    monkeypatch.setattr(graphs, "StepGraph", fail)
    cache = graphs.CudaGraphs(capture=False)
    buffers, x, y = step_inputs()
    assert cache.get("k", buffers, None, x, y) is None and cache.broken == said


def test_trees_of_buffers_are_cloned_and_copied_entry_by_entry():
    tree = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": torch.arange(3.0)}
    clone = graphs._clone_tree(tree)
    assert type(clone["a"]) is list and type(clone["a"][1]) is tuple and clone["a"][1][1] == 3
    assert clone["b"] is not tree["b"] and torch.equal(clone["b"], tree["b"])
    assert clone["a"][0] is not tree["a"][0] and torch.equal(clone["a"][0], tree["a"][0])
    target = clone["a"][1][0]
    graphs._copy_tree(clone, {"a": [torch.full((2,), 7.0), (torch.full((1,), 8.0), 3)], "b": torch.ones(3)})
    assert clone["a"][1][0] is target and target.item() == 8.0
    assert torch.equal(clone["a"][0], torch.full((2,), 7.0)) and torch.equal(clone["b"], torch.ones(3))
    assert torch.equal(tree["b"], torch.arange(3.0)) and torch.equal(tree["a"][0], torch.ones(2))


def test_the_capture_follows_pytorchs_recipe_and_a_replay_runs_the_graph(monkeypatch):
    """PyTorch's recipe for capturing a graph (the torch.cuda.graphs documentation): the side stream waits
    for the current one, the step is warmed up there (three times, as in its example), the current stream
    waits for the side one, then one run is captured; a replay launches the graph, not the eager step."""
    events, state = [], {"stream": "current", "capturing": False}

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            events.append(f"{self.name} waits for {other.name}")

    class Graph:
        def replay(self):
            events.append("replay")

    @contextlib.contextmanager
    def on(stream):
        before, state["stream"] = state["stream"], stream.name
        yield
        state["stream"] = before

    @contextlib.contextmanager
    def capturing(graph):
        assert isinstance(graph, Graph)
        state["capturing"] = True
        yield
        state["capturing"] = False

    current = Stream("current")
    for name, value in [("Stream", Stream), ("current_stream", lambda: current), ("stream", on),
                        ("CUDAGraph", Graph), ("graph", capturing)]:
        monkeypatch.setattr(torch.cuda, name, value)

    def step(buffers, x, y, mask):
        events.append(f"step on {state['stream']}" + (", captured" if state["capturing"] else ""))

    buffers, x, y = step_inputs()
    made = graphs.StepGraph(buffers, step, x, y, True)
    assert events == ["side waits for current", "step on side", "step on side", "step on side",
                      "current waits for side", "step on current, captured"]
    events.clear()
    made.replay(torch.ones(2, 4), torch.ones(2, dtype=torch.long), torch.tensor([True, False]))
    assert events == ["replay"]
    assert torch.equal(made.x, torch.ones(2, 4)) and made.mask.tolist() == [True, False]
