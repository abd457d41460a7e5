"""``-algo`` name -> "module:Class" of its server. Modules are imported only when chosen, so one
algorithm's optional dependency never breaks the others. Adding an algorithm = one line here."""
from __future__ import annotations

import importlib

ALGORITHMS = {
    "FedAvg": "flcore.servers.serveravg:FedAvgServer",
    "FedALA": "flcore.servers.serverala:FedALAServer",
    "Local": "flcore.servers.serverlocal:LocalServer",
}


def get_server_class(name: str):
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm '{name}'; choose one of: {', '.join(ALGORITHMS)}")
    module, cls = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), cls)
