"""The run configuration: parsed once from flags, then read-only. It never holds models or tensors."""
from __future__ import annotations

import argparse


class Config(argparse.Namespace):
    """An ``argparse.Namespace`` that refuses changes after it is built (``replace`` gives a new one)."""

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, key, value):
        raise AttributeError(f"the run config is read-only (tried to set '{key}'); use cfg.replace({key}=...)")

    def __delattr__(self, key):
        raise AttributeError("the run config is read-only")

    def replace(self, **changes) -> "Config":
        unknown = set(changes) - set(vars(self))
        if unknown:
            raise AttributeError(f"unknown config keys: {sorted(unknown)}")
        return Config(**{**vars(self), **changes})

    def to_dict(self) -> dict:
        return dict(vars(self))
