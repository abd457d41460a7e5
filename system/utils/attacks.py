"""Byzantine clients (``--attack``): a fixed, seeded set of malicious clients that poison their training
data or their upload, for any algorithm whose server averages a model.

The malicious set: round(f N) of the N clients (f = ``--attack_frac``), drawn once per run without
replacement from the (seed, run, "malicious") stream, which no other draw uses, so a run without an
attack is unchanged and the set does not depend on the algorithm. It is recorded in the result sidecar
(``malicious_clients``). Attacks, with W the global model the round started from (on the entries the
upload holds), W_i what malicious client i trained, and s = ``--attack_scale``:

- ``labelflip`` (data poisoning; Tolpegin et al., ESORICS 2020; Fang et al., USENIX Security 2020): every
  training label y of a malicious client becomes C - 1 - y (C classes) before training starts, for the
  whole run; its test split is untouched. The client then trains and uploads as usual.
- ``signflip`` (the reversed update; Li et al., AAAI 2019; Fang et al. 2020): it uploads W - s (W_i - W),
  s = 1 by default.
- ``scaled`` (explicit boosting; Bhagoji et al., ICML 2019): it uploads W + s (W_i - W), s = 10 by default.
- ``gaussian`` (a random vector in place of the update; Blanchard et al., NeurIPS 2017): it uploads
  W + ξ, ξ ~ N(0, s² I) from the (seed, run, "attack-noise", round, client) stream, s = 1 by default.

- ``alie``, ``ipm``, ``minmax``, ``minsum`` (omniscient, in update space; utils/update_attacks.py): every
  malicious client of the round uploads W + Δ, one Δ computed from the round's benign updates (each benign
  upload minus W), as the papers' attackers see them; n is the round's upload count and f its malicious
  ones (ALIE's z), s is IPM's ε (0.1 by default; the paper's other setting is 100), and
  ``--minmax_perturbation`` Min-Max's and Min-Sum's ∇p. A round without a benign upload leaves the
  malicious uploads as trained.
- ``backdoor`` (utils/backdoor.py): data poisoning plus model replacement.

The upload attacks change only the model's parameters; BatchNorm statistics and integer entries are sent
as trained. They act on what the client uploads, after training and before the server aggregates, so the
attacker knows W, as a client that received it does.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from utils.backdoor import replacement_boost
from utils.dp_client import aligned_names
from utils.errors import FLError
from utils.seeding import np_rng, torch_gen

OMNISCIENT = ("alie", "ipm", "minmax", "minsum")
ATTACKS = ("signflip", "gaussian", "labelflip", "scaled", *OMNISCIENT, "backdoor")
UPLOAD_ATTACKS = ("signflip", "gaussian", "scaled", *OMNISCIENT, "backdoor")  # what needs an averaging server
DEFAULT_SCALE = {"signflip": 1.0, "gaussian": 1.0, "scaled": 10.0, "ipm": 0.1}
DEFAULT_FRACTION = 0.2


def malicious_clients(seed: int, run: int, num_clients: int, fraction: float) -> list[int]:
    """The run's malicious client ids (sorted): round(fraction x num_clients) of them, seeded."""
    k = int(round(fraction * num_clients))
    return sorted(int(i) for i in np_rng(seed, run, "malicious").choice(num_clients, size=k, replace=False))


def flips_labels(cfg, run: int, cid: int) -> bool:
    """Whether client ``cid`` of run ``run`` trains on flipped labels (``--attack labelflip``)."""
    return (getattr(cfg, "attack", None) == "labelflip"
            and cid in malicious_clients(cfg.seed, run, cfg.num_clients, cfg.attack_frac))


def backdoors(cfg, run: int, cid: int) -> bool:
    """Whether client ``cid`` of run ``run`` trains on triggered images (``--attack backdoor``)."""
    return (getattr(cfg, "attack", None) == "backdoor"
            and cid in malicious_clients(cfg.seed, run, cfg.num_clients, cfg.attack_frac))


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """y -> C - 1 - y."""
    return num_classes - 1 - y


def poisoned_state(kind: str, state: dict, reference: dict, names: dict[str, str], params: set[str], scale: float,
                   noise: torch.Generator | None = None) -> dict:
    """One malicious upload's state (see the module docstring): ``state`` by upload name, ``reference`` the
    global model's state, ``names`` upload name -> global name, ``params`` the global model's parameter
    names; ``noise`` draws ξ for ``gaussian``."""
    out = dict(state)
    for k, name in names.items():
        if name not in params:
            continue
        w = reference[name].detach()
        local = state[k].to(w.device, w.dtype)
        if kind == "signflip":
            out[k] = w - scale * (local - w)
        elif kind == "scaled":
            out[k] = w + scale * (local - w)
        elif kind == "gaussian":
            out[k] = w + scale * torch.randn(w.shape, generator=noise, dtype=w.dtype).to(w.device)
        else:
            raise ValueError(f"'{kind}' is not an upload attack; choose one of {', '.join(UPLOAD_ATTACKS)}")
    return out


class Attack:
    """The run's attack: its kind, scale and malicious set (plain values: part of the server's state)."""

    def __init__(self, kind: str, fraction: float, scale: float | None, seed: int, run: int, num_clients: int,
                 perturbation: str = "std"):
        self.kind, self.seed, self.run = kind, seed, run
        self.scale = DEFAULT_SCALE.get(kind) if scale is None else float(scale)
        self.perturbation = perturbation
        self.malicious = malicious_clients(seed, run, num_clients, fraction)
        if len(self.malicious) >= num_clients:
            raise FLError(f"--attack_frac {fraction:g} makes all {num_clients} clients malicious; give a fraction that "
                          f"leaves at least one benign client (below {(num_clients - 0.5) / num_clients:.3g})")

    @classmethod
    def from_config(cls, cfg, run: int) -> "Attack | None":
        if getattr(cfg, "attack", None) is None:
            return None
        return cls(cfg.attack, cfg.attack_frac, cfg.attack_scale, cfg.seed, run, cfg.num_clients,
                   cfg.minmax_perturbation)

    def benign_mask(self, ids: list[int]) -> np.ndarray:
        """True for each of ``ids`` that is not malicious."""
        bad = set(self.malicious)
        return np.array([i not in bad for i in ids], dtype=bool)

    def count(self, uploads: list) -> int:
        """How many of ``uploads`` come from malicious clients (the round's f)."""
        bad = set(self.malicious)
        return sum(u.id in bad for u in uploads)

    def poison(self, uploads: list, reference: nn.Module, round_idx: int) -> list:
        """The round's uploads with each malicious one replaced by its attack (labelflip: unchanged)."""
        if self.kind not in UPLOAD_ATTACKS:
            return uploads
        if self.kind in OMNISCIENT:
            return self.poison_omniscient(uploads, reference, round_idx)
        ref = reference.state_dict()
        params = {n for n, _ in reference.named_parameters()}
        bad = set(self.malicious)
        kind, scale = self.kind, self.scale
        if self.kind == "backdoor":  # model replacement: boosted by s, by default n / (η k) (utils/backdoor.py)
            kind, scale = "scaled", self.scale or replacement_boost(len(uploads), self.count(uploads))
        out = []
        for u in uploads:
            if u.id in bad and u.state:
                noise = (torch_gen(self.seed, self.run, "attack-noise", round_idx, u.id) if kind == "gaussian"
                         else None)
                state = poisoned_state(kind, u.state, ref, aligned_names(reference, u.state), params, scale, noise)
                u = dataclasses.replace(u, state=state)
            out.append(u)
        return out

    def poison_omniscient(self, uploads: list, reference: nn.Module, round_idx: int = 0) -> list:
        """ALIE / IPM / Min-Max / Min-Sum: every malicious upload becomes W + Δ, Δ from the benign updates."""
        from utils.update_attacks import malicious_update

        bad = set(self.malicious)
        mal = [i for i, u in enumerate(uploads) if u.id in bad and u.state]
        good = [i for i, u in enumerate(uploads) if u.id not in bad and u.state]
        if not mal or not good:
            return uploads
        ref = reference.state_dict()
        params = {n for n, _ in reference.named_parameters()}
        names = {k: g for k, g in aligned_names(reference, uploads[mal[0]].state).items() if g in params}
        benign = torch.stack([update_row(uploads[i].state, ref, names) for i in good])
        try:
            delta = malicious_update(self.kind, benign, len(uploads), len(mal), self.scale or 0.0, self.perturbation)
        except ValueError as e:  # ALIE with a malicious majority this round
            raise FLError(f"--attack {self.kind}, round {round_idx}: {e}; lower --attack_frac or select more "
                          f"clients (-jr); results so far are kept") from None
        out = list(uploads)
        for i in mal:
            state, at = dict(uploads[i].state), 0
            for k, g in names.items():
                w = ref[g].detach()
                state[k] = (w.to(torch.float64) + delta[at:at + w.numel()].view(w.shape)).to(w.dtype)
                at += w.numel()
            out[i] = dataclasses.replace(uploads[i], state=state)
        return out


def update_row(state: dict, reference: dict, names: dict[str, str]) -> torch.Tensor:
    """One upload's update (upload - global model) on the entries ``names`` (upload name -> global name), as
    one float64 row."""
    return torch.cat([(state[k].to(torch.float64) - reference[g].detach().to(torch.float64)).reshape(-1)
                      for k, g in names.items()])
