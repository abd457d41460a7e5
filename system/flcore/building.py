"""A run's models and the factory its clients are built from, made once by the server's constructor (the
engine's side of model building: it calls the algorithm's ``build_model`` hook).

``initial_model(server)``: the common initial model, through the algorithm's ``build_model`` hook under the
(seed, run, "model") stream. ``client_factory(server)``: how every client is built, here or inside a
worker; with ``--client_models`` each client gets its own architecture's initial model
(``client_models(server)``, one per architecture under (seed, run, "client-model", name)).
"""
from __future__ import annotations

import torch

from flcore.trainmodel.models import build_client_model, build_model, set_device_layout
from flcore.trainmodel.parts import shared_shapes
from runtime.executors import ClientFactory
from utils.model_support import check_same_shape
from utils.seeding import torch_seeded


def model_of(server, name: str | None = None) -> torch.nn.Module:
    """The model ``-m`` (with ``--client_models`` the architecture ``name``, its classifier taking ``-fd``
    features: ``models.build_client_model``), as the base ``Server.build_model`` builds it."""
    cfg, data = server.cfg, server.data
    build = build_model if cfg.client_models is None else build_client_model
    return build(cfg.model if name is None else name, data.input_shape, data.num_classes, cfg.feature_dim,
                 cfg.vocab_size, config=data.config)


def initial_model(server) -> torch.nn.Module:
    """The run's common initial model (the same every time it is asked for)."""
    with torch_seeded(server.cfg.seed, server.run, "model"):
        return set_device_layout(server.build_model().to(server.device), server.device)


def client_models(server) -> dict[int, torch.nn.Module]:
    """``--client_models``: client id -> the initial model of its architecture (one per architecture,
    seeded by its name, as every client starts from one model without the flag): reshaped by the
    algorithm's ``build_model``, or as built where it is a personal model beside the shared one
    (``model_support.personal``). The part ``model_support.same_shape`` names must have one shape on every
    architecture and the server's model, or the run stops here with one line."""
    support = server.declares.model_support
    built = {}
    for name in dict.fromkeys(server.client_model_names):
        with torch_seeded(server.cfg.seed, server.run, "client-model", name):
            model = model_of(server, name) if support.personal else server.build_model(name)
        built[name] = set_device_layout(model.to(server.device), server.device)
    if support.same_shape:
        x = server.data.clients[0].x_train[:1].to(server.device)
        shapes = {name: shared_shapes(m, support.same_shape, x) for name, m in built.items()}
        if support.same_shape == "head":
            shapes["the server's model"] = shared_shapes(server.global_model, "head", x)
        check_same_shape(server.cfg, support.same_shape, shapes)
    return {cid: built[name] for cid, name in enumerate(server.client_model_names)}


def client_factory(server, model: torch.nn.Module | None = None) -> ClientFactory:
    """How every client is built, here or inside a worker: ``client_class(cfg, cid, data, model, run)``
    under its own seeded stream, ``model`` by default the server's global model; with ``--client_models``
    each client's own architecture (``client_models``) replaces it, or with ``model_support.personal``
    comes as the keyword ``own_model``."""
    model = server.global_model if model is None else model
    if server.client_model_names is None:
        return ClientFactory(server.declares.client_class, server.cfg, server.run, model)
    return ClientFactory(server.declares.client_class, server.cfg, server.run, model, client_models(server),
                         server.declares.model_support.personal)
