"""``--aggregator``: robust aggregation for any algorithm whose server averages a model. The rule (one function
each, plugins/aggregators.py) replaces the sample-weighted mean inside ``Server.average_uploads``, the seam
every server computation that reads model uploads goes through.

f (``--krum_f``, for the rules that take it) is by default the number of the round's uploads that come from
malicious clients (those selected, not dropped out and not late), so it follows each round. A rule that
degenerates in a round (the trimmed mean's k = 0 at small n, the median of two uploads, Multi-Krum with
f = 0, Bulyan below 4f + 3 uploads) says so once per run, on stderr. Centered clipping keeps its center (the
previous aggregate update, one per averaged part of a model) here, checkpointed with the server.

No bypass: the algorithm's ``aggregate`` receives its uploads sealed (``utils.entries.SealedUpload``): only
``average_uploads`` opens them, so a server computation that reads uploaded content elsewhere (a head
combination, a generator trained on the uploaded heads, a regulariser on uploaded embeddings) stops the run
with one line; such an algorithm declares ``robust_refusal`` and is refused at start-up
(tests/test_no_bypass.py runs every registered algorithm this way)."""
from __future__ import annotations

import sys

from plugins import Plugin, registered
from utils.errors import FLError, require

RULES = registered("aggregators", "rule")  # name -> {"takes_f": True} or {}, read without torch
AGGREGATORS = tuple(RULES)
F_RULES = tuple(n for n, kw in RULES.items() if kw.get("takes_f"))


class RobustAggregation(Plugin):
    averages = True

    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("robust aggregation (any algorithm whose server averages a model; README: Attacks "
                              "and robust aggregation)")
        g.add_argument("--aggregator", default="mean", choices=list(AGGREGATORS),
                       help="how the uploads are combined: the sample-weighted mean (FedAvg), the coordinate-wise "
                            "median or trimmed mean (Yin et al. 2018), Krum or Multi-Krum (Blanchard et al. 2017), "
                            "the weighted geometric median (Weiszfeld; RFA, Pillutla et al. 2022), Bulyan (El Mhamdi "
                            "et al. 2018), centered clipping (Karimireddy et al. 2021), norm bounding of the updates "
                            "(Sun et al. 2019); plugins/aggregators.py")
        g.add_argument("--trim_frac", type=float, default=0.2,
                       help="--aggregator trimmed_mean: share of the uploads dropped at each end, per coordinate")
        g.add_argument("--krum_f", type=int, default=None,
                       help="--aggregator krum / multikrum / bulyan: the number f of Byzantine uploads assumed "
                            "(default: the round's uploads from malicious clients, 0 without --attack)")
        g.add_argument("--cclip_tau", type=float, default=10.0,
                       help="--aggregator cclip: clipping radius τ around the previous aggregate update "
                            "(Karimireddy et al.'s code: 10)")
        g.add_argument("--cclip_iters", type=int, default=1,
                       help="--aggregator cclip: clipping iterations per round (Karimireddy et al.: 1)")
        g.add_argument("--norm_bound", type=float, default=None,
                       help="--aggregator normclip: the bound M on each update's L2 norm (Sun et al. 2019) "
                            "(default: the median of the round's update norms)")

    @classmethod
    def check(cls, cfg, server_cls, given):
        if cfg.aggregator != "mean" and server_cls.declares.averaging_refusal:
            raise FLError(f"--aggregator: {cfg.algorithm} cannot take it: {server_cls.declares.averaging_refusal}")
        if cfg.aggregator != "mean" and server_cls.declares.robust_refusal:
            raise FLError(f"--aggregator: {cfg.algorithm} cannot take it: {server_cls.declares.robust_refusal}")
        takes_f = ", ".join(F_RULES[:-1]) + f" or {F_RULES[-1]}" if len(F_RULES) > 1 else F_RULES[0]
        checks = [
            (cfg.krum_f is None or cfg.aggregator in F_RULES, f"--krum_f needs --aggregator {takes_f}"),
            (cfg.aggregator == "cclip" or (cfg.cclip_tau == 10.0 and cfg.cclip_iters == 1),
             "--cclip_tau and --cclip_iters need --aggregator cclip"),
            (cfg.norm_bound is None or cfg.aggregator == "normclip", "--norm_bound needs --aggregator normclip"),
        ]
        require(checks)
        return cfg

    @classmethod
    def build(cls, cfg, server):
        return cls() if cfg.aggregator != "mean" else None

    def __init__(self):
        self.noted: list[str] = []  # what was said about a degenerate round (once per run)
        self.centers: dict = {}  # --aggregator cclip: the previous aggregate update per averaged part

    def note(self, cfg, text: str) -> None:
        if text not in self.noted:
            self.noted.append(text)
            print(f"warning: --aggregator {cfg.aggregator}: {text} (said once per run)", file=sys.stderr)

    def wrap_aggregate(self, server, step):
        from utils.entries import SealedUpload

        why = f"--aggregator {server.cfg.aggregator}: {server.cfg.algorithm}'s server reads"

        def sealed(uploads):
            step([SealedUpload(u, why) for u in uploads])
        return sealed

    @staticmethod
    def center_key(server, target, prefix: str) -> str:
        """The name a centered rule's state is kept under, one per averaged part of a model."""
        name = next((f"model.{n}" if n else "model" for n, m in server.global_model.named_modules() if m is target),
                    type(target).__name__)
        return f"{name}:{prefix}"

    def combine(self, server, uploads, keys, reference, target, prefix):
        from plugins.aggregators import aggregate, flatten

        cfg = server.cfg
        f = cfg.krum_f
        if f is None:  # the round's uploads from malicious clients
            ids = [u.id for u in uploads]
            f = sum(p.attackers(ids) for p in server.plugins)
        key = self.center_key(server, target, prefix)
        try:
            agg = aggregate([u.state for u in uploads], [u.weight for u in uploads], cfg.aggregator, keys,
                            cfg.trim_frac, f, reference, self.centers.get(key), cfg.cclip_tau, cfg.cclip_iters,
                            cfg.norm_bound, lambda text: self.note(cfg, text))
        except ValueError as e:  # too few uploads for Krum, Bulyan or the trimmed mean this round
            raise FLError(f"--aggregator {cfg.aggregator}, round {server.round_idx}: {e}; lower --krum_f or "
                          f"--trim_frac, or select more clients (-jr); results so far are kept") from None
        if cfg.aggregator == "cclip":  # the next round's center: this round's aggregate update
            floating = [k for k in agg if agg[k].is_floating_point()]
            self.centers[key] = flatten([agg], floating)[0] - flatten([reference], floating)[0]
        return agg
