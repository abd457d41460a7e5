"""``--attack``: Byzantine clients, a fixed seeded malicious set that poisons its training data or its uploads
(the attacks themselves, one function each: plugins/attacks.py), for any algorithm whose server averages a
model (a data-only attack: any algorithm). Adds the benign clients' summary to every evaluation
(``benign_test_acc``, ...) and, for the backdoor, the trigger's success rate (``backdoor_asr``)."""
from __future__ import annotations

import dataclasses

from plugins import Plugin, declarations
from utils.errors import FLError, require

DEFAULT_FRACTION = 0.2


def _read() -> dict[str, dict]:
    """name -> {"roles": {...}, "scale": default or None, "scalable": bool}, read without torch."""
    out: dict[str, dict] = {}
    for name, kw in declarations("attacks", "attack"):
        entry = out.setdefault(name, {"roles": set(), "scale": None, "scalable": False})
        entry["roles"].add(kw.get("role", "upload"))
        entry["scale"] = entry["scale"] if kw.get("scale") is None else kw["scale"]
        entry["scalable"] |= kw.get("scalable", False) or kw.get("scale") is not None
    return out


ATTACKS = _read()


def poisons(cfg, role: str) -> bool:
    """Whether the run's attack (if any) has a function of ``role`` ("data" or "upload")."""
    return getattr(cfg, "attack", None) is not None and role in ATTACKS[cfg.attack]["roles"]


class Attack(Plugin):
    """The run's attack: its kind, scale and malicious set (plain values: part of the server's state)."""

    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("attacks (any algorithm whose server averages a model; README: Attacks and robust "
                              "aggregation)")
        g.add_argument("--attack", default=None, choices=list(ATTACKS),
                       help="malicious clients flip their training labels (y -> C-1-y) or poison their upload: "
                            "W - s(W_i - W), W + N(0, s^2), W + s(W_i - W); omniscient, from the round's benign "
                            "updates: ALIE (Baruch et al. 2019), IPM (Xie et al. 2020), Min-Max / Min-Sum (Shejwalkar "
                            "& Houmansadr 2021); backdoor: a pixel trigger with model replacement (Bagdasaryan et al. "
                            "2020); plugins/attacks.py (default: none)")
        g.add_argument("--attack_frac", type=float, default=None,
                       help="share of the clients that are malicious, a fixed set drawn from --seed "
                            f"(default: {DEFAULT_FRACTION:g} with --attack)")
        g.add_argument("--attack_scale", type=float, default=None,
                       help="s of the upload attacks, IPM's ε, or the backdoor's boost γ (the paper's other IPM setting: "
                            "100; the backdoor's k attackers of a round replace the model together, so one attacker "
                            "boosts by the paper's n / η) (default: per attack: 1 signflip, 1 gaussian, 10 scaled, "
                            "0.1 ipm, n / (η k) backdoor)")
        g.add_argument("--backdoor_target", type=int, default=0,
                       help="--attack backdoor: the class triggered images are labelled and should be classified as")
        g.add_argument("--backdoor_frac", type=float, default=0.3,
                       help="--attack backdoor: share of a malicious client's training images that carry the trigger "
                            "(the rest stay clean: a mix, as in Bagdasaryan et al. 2020)")
        g.add_argument("--trigger_size", type=int, default=3,
                       help="--attack backdoor: side of the full-intensity square trigger in the bottom-right corner")
        g.add_argument("--minmax_perturbation", default="std", choices=["unit_vec", "std", "sign"],
                       help="--attack minmax / minsum: the perturbation vector, inverse unit vector -μ/||μ||, inverse "
                            "std -σ or inverse sign -sign(μ) of the benign updates (Shejwalkar & Houmansadr 2021)")

    @classmethod
    def check(cls, cfg, server_cls, given):
        if poisons(cfg, "upload") and server_cls.declares.averaging_refusal:
            raise FLError(f"--attack: {cfg.algorithm} cannot take it: {server_cls.declares.averaging_refusal}")
        checks = [
            (cfg.attack is not None or (cfg.attack_frac is None and cfg.attack_scale is None),
             "--attack_frac and --attack_scale need --attack"),
            (cfg.attack is None or cfg.attack_scale is None or ATTACKS[cfg.attack]["scalable"],
             f"--attack {cfg.attack} takes no --attack_scale"),
            (cfg.attack == "backdoor" or (cfg.backdoor_target == 0 and cfg.backdoor_frac == 0.3
                                          and cfg.trigger_size == 3),
             "--backdoor_target, --backdoor_frac and --trigger_size need --attack backdoor"),
            (cfg.attack in ("minmax", "minsum") or cfg.minmax_perturbation == "std",
             "--minmax_perturbation needs --attack minmax or minsum"),
        ]
        require(checks)
        if cfg.attack is not None and cfg.attack_frac is None:
            return cfg.replace(attack_frac=DEFAULT_FRACTION)
        return cfg

    @classmethod
    def build(cls, cfg, server):
        if getattr(cfg, "attack", None) is None:
            return None
        data = server.data
        if cfg.attack == "backdoor" and cfg.backdoor_target >= data.num_classes:
            raise FLError(f"--backdoor_target {cfg.backdoor_target}: split '{data.name}' has classes 0.."
                          f"{data.num_classes - 1}")
        attack = cls(cfg.attack, cfg.attack_frac, cfg.attack_scale, cfg.seed, server.run, cfg.num_clients)
        if server.recorder is not None:
            server.recorder.meta["malicious_clients"] = list(attack.malicious)
        return attack

    def __init__(self, kind: str, fraction: float, scale: float | None, seed: int, run: int, num_clients: int):
        from plugins.attacks import malicious_clients

        self.kind, self.seed, self.run = kind, seed, run
        self.scale = ATTACKS[kind]["scale"] if scale is None else float(scale)
        self.malicious = malicious_clients(seed, run, num_clients, fraction)
        if len(self.malicious) >= num_clients:
            raise FLError(f"--attack_frac {fraction:g} makes all {num_clients} clients malicious; give a fraction that "
                          f"leaves at least one benign client (below {(num_clients - 0.5) / num_clients:.3g})")

    @classmethod
    def client_data(cls, cfg, run, cid, data):
        """A data attack (``labelflip``, ``backdoor``) poisons a malicious client's training data once,
        before training."""
        if not poisons(cfg, "data"):
            return data
        from plugins.attacks import ATTACKS as FUNCTIONS, malicious_clients

        if cid not in malicious_clients(cfg.seed, run, cfg.num_clients, cfg.attack_frac):
            return data
        x, y = FUNCTIONS[cfg.attack]["data"](data, cfg, run, cid)
        return dataclasses.replace(data, x_train=x, y_train=y)

    def attackers(self, ids: list[int]) -> int:
        bad = set(self.malicious)
        return sum(i in bad for i in ids)

    def benign_mask(self, ids: list[int]):
        """True for each of ``ids`` that is not malicious."""
        import numpy as np

        bad = set(self.malicious)
        return np.array([i not in bad for i in ids], dtype=bool)

    def on_uploads(self, server, active, uploads):
        """The round's uploads with each malicious one replaced by its attack (a data-only attack: unchanged)."""
        if "upload" not in ATTACKS[self.kind]["roles"]:
            return uploads
        from plugins.attacks import poison

        return poison(self.kind, uploads, server.global_model, set(self.malicious), self.scale, self.seed, self.run,
                      server.round_idx, server.cfg)

    def describe(self, summary: dict) -> tuple[str, str]:
        benign = f"benign acc {summary['benign_test_acc']:.4f}, all "
        if "backdoor_asr" in summary:
            benign = f"backdoor ASR {summary['backdoor_asr']:.4f} | {benign}"
        return benign, ""

    def metrics(self, server, tests, trains) -> dict:
        """The evaluation's summary over the benign clients only (``benign_test_acc``, ...); for the backdoor
        the trigger's success on the benign clients' own models (``backdoor_asr``)."""
        import numpy as np

        from utils.metrics import summarize

        ok = self.benign_mask([c.id for c in server.clients])
        benign = summarize(tests[ok, 0], tests[ok, 1], tests[ok, 2], trains[ok, 0], trains[ok, 1])
        out = {f"benign_{k}": v for k, v in benign.items() if k != "client_test_acc"}
        if self.kind == "backdoor":
            hits, n = np.array(server.call_clients([c for c, b in zip(server.clients, ok) if b], backdoor_metrics),
                               dtype=np.float64).reshape(-1, 2).sum(0)
            out["backdoor_asr"] = float(hits / n) if n else float("nan")
        return out


def backdoor_metrics(client) -> tuple[int, int]:
    """``--attack backdoor``: (hits, eligible) of the trigger on ``client``'s test split: its test images whose
    label is not the target, and how many of them its personalised model (``eval_model``) classifies as the
    target once stamped (utils/backdoor.py). Run where the client lives."""
    import torch

    from utils.amp import autocast
    from utils.backdoor import success_counts
    from utils.metrics import predict

    cfg, model = client.cfg, client.eval_model()
    was_training = model.training
    with torch.no_grad(), autocast(cfg, client.device):
        counts = success_counts(lambda x: predict(model, x, cfg.eval_batch_size), client.x_test, client.y_test,
                                cfg.backdoor_target, cfg.trigger_size, client.white)
    model.train(was_training)
    return counts
