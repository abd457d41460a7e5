"""``-algo`` name -> "module:Class" of its server. Modules are imported only when chosen, so one
algorithm's optional dependency never breaks the others. Adding an algorithm = one line here."""
from __future__ import annotations

import importlib

ALGORITHMS = {
    "FedAvg": "flcore.servers.serveravg:FedAvgServer",
    "FedALA": "flcore.servers.serverala:FedALAServer",
    "Local": "flcore.servers.serverlocal:LocalServer",
    "FedProx": "flcore.servers.serverprox:FedProxServer",
    "SCAFFOLD": "flcore.servers.serverscaffold:SCAFFOLDServer",
    "FedAvg-C": "flcore.servers.serveravgc:FedAvgCServer",
    "FedProx-C": "flcore.servers.serverproxc:FedProxCServer",
    "Per-FedAvg": "flcore.servers.serverperavg:PerFedAvgServer",
    "FedRep": "flcore.servers.serverrep:FedRepServer",
    "Ditto": "flcore.servers.serverditto:DittoServer",
    "pFedMe": "flcore.servers.serverpfedme:PFedMeServer",
    "FedAMP": "flcore.servers.serveramp:FedAMPServer",
    "FedPHP": "flcore.servers.serverphp:FedPHPServer",
    "FedFomo": "flcore.servers.serverfomo:FedFomoServer",
    "APPLE": "flcore.servers.serverapple:APPLEServer",
    "PartialFed": "flcore.servers.serverpartial:PartialFedServer",
    "FedDyn": "flcore.servers.serverdyn:FedDynServer",
    "FedLC": "flcore.servers.serverlc:FedLCServer",
    "FedNTD": "flcore.servers.serverntd:FedNTDServer",
    "FedPer": "flcore.servers.serverper:FedPerServer",
    "LG-FedAvg": "flcore.servers.serverlg:LGFedAvgServer",
    "FedRoD": "flcore.servers.serverrod:FedRoDServer",
    "FedBABU": "flcore.servers.serverbabu:FedBABUServer",
    "MOON": "flcore.servers.servermoon:MOONServer",
    "FedGen": "flcore.servers.servergen:FedGenServer",
    "FedBN": "flcore.servers.serverbn:FedBNServer",
    "APFL": "flcore.servers.serverapfl:APFLServer",
    "FedMTL": "flcore.servers.servermtl:FedMTLServer",
    "FedCross": "flcore.servers.servercross:FedCrossServer",
    "FedGC": "flcore.servers.servergc:FedGCServer",
    "FedCP": "flcore.servers.servercp:FedCPServer",
    "GPFL": "flcore.servers.servergpfl:GPFLServer",
    "FedDBE": "flcore.servers.serverdbe:FedDBEServer",
    "FedCAC": "flcore.servers.servercac:FedCACServer",
    "FedGH": "flcore.servers.servergh:FedGHServer",
    "FedAS": "flcore.servers.serveras:FedASServer",
    "FD": "flcore.servers.serverfd:FDServer",
    "FML": "flcore.servers.serverfml:FMLServer",
    "FedKD": "flcore.servers.serverkd:FedKDServer",
    "FedProto": "flcore.servers.serverproto:FedProtoServer",
    "FedPCL": "flcore.servers.serverpcl:FedPCLServer",
    "FedPAC": "flcore.servers.serverpac:FedPACServer",
    "PFL-DA": "flcore.servers.serverda:PFLDAServer",
    "FedAvgM": "flcore.servers.serveravgm:FedAvgMServer",
    "FedAdagrad": "flcore.servers.serveradagrad:FedAdagradServer",
    "FedAdam": "flcore.servers.serveradam:FedAdamServer",
    "FedYogi": "flcore.servers.serveryogi:FedYogiServer",
    "FedNova": "flcore.servers.serverfednova:FedNovaServer",
}


# PFLlib's -algo spellings that differ from the names above.
ALIASES = {"PerAvg": "Per-FedAvg", "FedROD": "FedRoD", "FedAvgC": "FedAvg-C", "FedProxC": "FedProx-C"}


def canonical_name(name: str) -> str:
    """The registered name for ``name``: itself, a PFLlib alias, or a registered name or alias that differs
    only in case; unknown names come back unchanged (the caller reports them)."""
    if name in ALGORITHMS:
        return name
    if name in ALIASES:
        return ALIASES[name]
    folded = {k.lower(): k for k in ALGORITHMS} | {k.lower(): v for k, v in ALIASES.items()}
    return folded.get(name.lower(), name)


def pfllib_flag_defaults(server_class) -> dict:
    """PFLlib's defaults of the flags an algorithm adds (``declares.pfllib_defaults``, gathered over its
    server's bases: FedProx-C's are FedProx's and fine-tuning's), marked by the start-up print where a run
    differs."""
    return dict(server_class.declares.pfllib_defaults)


def get_server_class(name: str):
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm '{name}'; choose one of: {', '.join(ALGORITHMS)}")
    module, cls = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), cls)
