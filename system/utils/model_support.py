"""The ``--client_models`` declarations: whether an algorithm can give its clients different architectures
(each server's ``model_support``, a ``ModelSupport``), what then crosses the wire, and the start-up check
(``check_model_support``). Plain data, no torch: every server module imports it, and README's table of
model-heterogeneous algorithms is ``support_table`` of every registered algorithm's."""
from __future__ import annotations

import dataclasses

from utils.errors import FLError

AVERAGES_MODELS = ("its server averages model entries across clients (the whole model or shared layers), which "
                   "needs one architecture on every client")


@dataclasses.dataclass(frozen=True)
class ModelSupport:
    """An algorithm's one ``--client_models`` declaration (its server's ``model_support``):

    - ``refusal``: why it refuses clients with different architectures ("" when it takes them);
    - ``shares``: what crosses the wire when they differ (one line, README's table);
    - ``same_shape``: the part whose shape must agree between every client's architecture (and the server's
      model), checked at start-up: ``"logits"`` (the classifier's output), ``"features"`` (the classifier's
      input, ``-fd`` wide), ``"head"`` (the classifier's entries) or ``""`` (nothing is shared);
    - ``personal``: where a client's own architecture goes: False, its model itself (the one it trains and is
      evaluated on); True, a personal model beside the shared one, which stays ``-m`` on every client (FML's
      local model beside the meme model, FedKD's mentor beside the mentee).

    ``check_model_support`` enforces the refusal at start-up; the server checks ``same_shape`` once the
    models are built (tests/test_hetero.py covers every registered algorithm)."""
    refusal: str = AVERAGES_MODELS
    shares: str = ""
    same_shape: str = ""
    personal: bool = False

    def __post_init__(self):
        if self.same_shape not in ("", "logits", "features", "head"):
            raise ValueError(f"same_shape must be '', logits, features or head (got {self.same_shape!r})")


def check_model_support(cfg, server_cls) -> None:
    """Refuse ``--client_models`` where the algorithm's ``model_support`` says why."""
    refusal = server_cls.declares.model_support.refusal
    if getattr(cfg, "client_models", None) and refusal:
        raise FLError(f"--client_models: {cfg.algorithm} is refused: {refusal}; give every client -m instead "
                      f"(README: Clients with different models lists the algorithms that take it)")


def check_same_shape(cfg, part: str, shapes: dict[str, dict]) -> None:
    """``shapes``: each architecture's (and the server model's) shapes of the shared ``part``
    (``parts.shared_shapes``); one line naming two that differ."""
    (first, want), *rest = shapes.items()
    for name, got in rest:
        if got != want:
            raise FLError(f"--client_models: {cfg.algorithm} exchanges {part} of one shape, but {first} gives {want} "
                          f"and {name} gives {got}; every architecture's classifier must take -fd "
                          f"({cfg.feature_dim}) features to {cfg.num_classes} classes")


def support_table(servers: dict) -> str:
    """README's table of the algorithms that take ``--client_models`` (``servers``: -algo name -> server
    class, in registry order): what each shares and where a client's own architecture goes."""
    rows = ["| algorithm | what crosses the wire | a client's own architecture is |", "|---|---|---|"]
    for name, cls in servers.items():
        s = cls.declares.model_support
        if not s.refusal:
            where = "its personal model beside the shared `-m` model" if s.personal else "its model"
            rows.append(f"| {name} | {s.shares} | {where} |")
    return "\n".join(rows) + "\n"
