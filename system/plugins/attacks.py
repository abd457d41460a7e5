"""Byzantine clients (``--attack``, the plug-in plugins/attack.py): what a malicious client does, one function
per attack, registered with ``@attack("name", ...)``. Adding an attack is one function here: ``--attack``
lists it (read from this file's source without torch: plugins/__init__.py ``registered``).

The decorator's keywords (plain literals): ``role`` is "upload" (the function gets an ``AttackRound``, the
round's uploads after training, and returns the malicious clients' poisoned parameters) or "data" (the
function gets a malicious client's ``ClientData`` once, before training, and returns its training inputs
and labels poisoned); an attack may register one function of each role under its name (``backdoor``).
``scale`` is the default of ``--attack_scale`` (an attack without one takes no ``--attack_scale``, unless it
says ``scalable=True``); these two are read from this file's source only (plugins/attack.py), the decorator
itself registers the function under its name and role.

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
from collections.abc import Callable

import torch

from utils.entries import aligned_names
from utils.errors import FLError
from utils.seeding import np_rng, torch_gen

ATTACKS: dict[str, dict[str, Callable]] = {}  # name -> {role: function}


def attack(name: str, *, role: str = "upload", **declared):
    """Register the decorated function as ``--attack name``'s ``role`` (see the module docstring); ``declared``
    (``scale``, ``scalable``) is read from this file's source by plugins/attack.py, not here."""
    def register(fn):
        ATTACKS.setdefault(name, {})[role] = fn
        return fn
    return register


@dataclasses.dataclass
class AttackRound:
    """What an upload attack sees in a round: ``reference`` (the global model's parameters W, by name),
    ``uploads`` (client id -> its trained parameters W_i, by the same names, every upload of the round that
    holds a model: an omniscient attacker reads the benign ones too), ``malicious`` (the ids among them it
    controls, in upload order), ``n`` (the round's upload count), ``scale`` (``--attack_scale`` or the
    attack's default), ``noise(cid)`` (that client's own stream this round), ``round_idx`` and ``cfg``."""
    reference: dict[str, torch.Tensor]
    uploads: dict[int, dict[str, torch.Tensor]]
    malicious: list[int]
    n: int
    scale: float | None
    noise: Callable[[int], torch.Generator]
    round_idx: int
    cfg: object

    def benign_rows(self) -> torch.Tensor:
        """The benign uploads' updates W_i - W (parameters only, float64), one row each, in upload order."""
        bad = set(self.malicious)
        return torch.stack([torch.cat([(s[k].to(torch.float64) - w.to(torch.float64)).reshape(-1)
                                       for k, w in self.reference.items()])
                            for c, s in self.uploads.items() if c not in bad])

    def plus(self, delta: torch.Tensor) -> dict[str, torch.Tensor]:
        """W + ``delta`` (a flat float64 update over ``reference``'s entries), in W's dtypes."""
        out, at = {}, 0
        for k, w in self.reference.items():
            out[k] = (w.to(torch.float64) + delta[at:at + w.numel()].view(w.shape)).to(w.dtype)
            at += w.numel()
        return out


@attack("labelflip", role="data")
def labelflip(data, cfg, run: int, cid: int):
    """y -> C - 1 - y (C = ``-ncl``, the split's class count)."""
    return data.x_train, flip_labels(data.y_train, cfg.num_classes)


@attack("signflip", scale=1.0)
def signflip(r: AttackRound) -> dict:
    """W - s (W_i - W)."""
    return {c: {k: w - r.scale * (r.uploads[c][k] - w) for k, w in r.reference.items()} for c in r.malicious}


@attack("gaussian", scale=1.0)
def gaussian(r: AttackRound) -> dict:
    """W + ξ, ξ ~ N(0, s² I)."""
    out = {}
    for c in r.malicious:
        noise = r.noise(c)
        out[c] = {k: w + r.scale * torch.randn(w.shape, generator=noise, dtype=w.dtype).to(w.device)
                  for k, w in r.reference.items()}
    return out


@attack("scaled", scale=10.0)
def scaled(r: AttackRound) -> dict:
    """W + s (W_i - W)."""
    return {c: {k: w + r.scale * (r.uploads[c][k] - w) for k, w in r.reference.items()} for c in r.malicious}


def omniscient(kind: str, r: AttackRound) -> dict:
    """ALIE / IPM / Min-Max / Min-Sum: every malicious upload becomes W + Δ, one Δ from the benign updates
    (utils/update_attacks.py); a round without a benign upload leaves them as trained."""
    from utils.update_attacks import malicious_update

    if len(r.malicious) == len(r.uploads):
        return {}
    try:
        delta = malicious_update(kind, r.benign_rows(), r.n, len(r.malicious), r.scale, r.cfg.minmax_perturbation)
    except ValueError as e:  # ALIE with a malicious majority this round
        raise FLError(f"--attack {kind}, round {r.round_idx}: {e}; lower --attack_frac or select more "
                      f"clients (-jr); results so far are kept") from None
    poisoned = r.plus(delta)
    return {c: poisoned for c in r.malicious}


@attack("alie")
def alie(r: AttackRound) -> dict:
    return omniscient("alie", r)


@attack("ipm", scale=0.1)
def ipm(r: AttackRound) -> dict:
    return omniscient("ipm", r)


@attack("minmax")
def minmax(r: AttackRound) -> dict:
    return omniscient("minmax", r)


@attack("minsum")
def minsum(r: AttackRound) -> dict:
    return omniscient("minsum", r)


@attack("backdoor", role="data")
def backdoor_data(data, cfg, run: int, cid: int):
    """A seeded share of the training images stamped with the trigger and relabelled (utils/backdoor.py)."""
    from utils.backdoor import poison_training

    x, y = data.x_train, data.y_train
    if data.white is None or min(x.shape[-2:]) < cfg.trigger_size:
        raise FLError(f"--attack backdoor stamps a {cfg.trigger_size}x{cfg.trigger_size} trigger on images; "
                      f"this split's inputs have shape {tuple(x.shape[1:])}: use an image split or a smaller "
                      f"--trigger_size")
    return poison_training(x, y, cfg.backdoor_target, cfg.backdoor_frac, cfg.trigger_size, data.white,
                           torch_gen(cfg.seed, run, "backdoor", cid))


@attack("backdoor", scalable=True)
def backdoor(r: AttackRound) -> dict:
    """Model replacement: W + s (W_i - W), s = ``--attack_scale``, by default n / (η k) (utils/backdoor.py)."""
    from utils.backdoor import replacement_boost

    boost = r.scale or replacement_boost(r.n, len(r.malicious))
    return scaled(dataclasses.replace(r, scale=boost))


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """y -> C - 1 - y."""
    return num_classes - 1 - y


def malicious_clients(seed: int, run: int, num_clients: int, fraction: float) -> list[int]:
    """The run's malicious client ids (sorted): round(fraction x num_clients) of them, seeded."""
    k = int(round(fraction * num_clients))
    return sorted(int(i) for i in np_rng(seed, run, "malicious").choice(num_clients, size=k, replace=False))


def poison(kind: str, uploads: list, reference, malicious: set[int], scale: float | None, seed: int, run: int,
           round_idx: int, cfg) -> list:
    """The round's uploads with each malicious one's parameters replaced by upload attack ``kind``'s
    (``reference``: the global model, whose ``state_dict`` tensors are detached); other entries and benign
    uploads as sent."""
    fn = ATTACKS[kind]["upload"]
    ref = reference.state_dict()
    params = {n for n, _ in reference.named_parameters()}
    names, trained = {}, {}
    for u in uploads:
        if not u.state:
            continue
        names[u.id] = {k: n for k, n in aligned_names(reference, u.state).items() if n in params}
        trained[u.id] = {n: u.state[k].to(ref[n].device, ref[n].dtype) for k, n in names[u.id].items()}
    bad = [u.id for u in uploads if u.id in malicious and u.id in trained]
    if not bad:
        return uploads
    weights = {n: ref[n] for n in trained[bad[0]]}
    r = AttackRound(weights, trained, bad, len(uploads), scale,
                    lambda cid: torch_gen(seed, run, "attack-noise", round_idx, cid), round_idx, cfg)
    poisoned = fn(r)
    out = []
    for u in uploads:
        if u.id in poisoned:
            state = dict(u.state)
            state.update({k: poisoned[u.id][n] for k, n in names[u.id].items()})
            u = dataclasses.replace(u, state=state)
        out.append(u)
    return out
