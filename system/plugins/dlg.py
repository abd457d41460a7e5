"""``-dlg``: the DLG / iDLG / IG evaluation of what clients expose, for any algorithm (utils/privacy_monitor.py;
the attacks themselves: utils/dlg.py). It snapshots the attacked clients' start models before training and
attacks their uploads before aggregation (after an ``--attack`` poisoned them)."""
from __future__ import annotations

from plugins import Plugin


class DLGMonitor(Plugin):
    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("privacy evaluation (any algorithm): DLG/iDLG/IG, see docs/privacy.md")
        g.add_argument("-dlg", "--dlg_eval", action="store_true",
                       help="attack a few clients every -dlgg rounds by gradient inversion (PFLlib's flag)")
        g.add_argument("-dlgg", "--dlg_gap", type=int, default=100, help="attack every N rounds (PFLlib: 100)")
        g.add_argument("-bnpc", "--batch_num_per_client", type=int, default=2,
                       help="attacks per attacked client (PFLlib: 2)")
        g.add_argument("--dlg_clients", type=int, default=2,
                       help="clients attacked per attacked round, drawn from the round's active clients")
        g.add_argument("-dlga", "--dlg_attack", default="dlg", choices=["dlg", "idlg", "ig"],
                       help="DLG (Zhu et al. 2019: inputs and labels), iDLG (Zhao et al. 2020: label from the "
                            "classifier gradient's sign, then inputs) or ig, Inverting Gradients (Geiping et al. 2020: "
                            "cosine matching + total variation, signed Adam, iDLG's label)")
        g.add_argument("--ig_iters", type=int, default=4000,
                       help="-dlga ig: Adam iterations per attack (the reference code's CIFAR-10 setting: 4000)")
        g.add_argument("--ig_tv", type=float, default=1e-4, help="-dlga ig: total-variation weight alpha_TV (the reference code's value)")
        g.add_argument("--dlg_iters", type=int, default=300, help="L-BFGS iterations per attack (DLG paper: 300)")
        g.add_argument("--dlg_batch", type=int, default=1, help="images per attacked batch (DLG paper: 1)")
        g.add_argument("--dlg_target", default="gradient", choices=["gradient", "update"],
                       help="gradient: one true batch gradient of the model the client starts from (the textbook "
                            "threat; DP-SGD-noised with -dp); update: the client's upload as (start - upload) / "
                            "(lr * local steps)")

    @classmethod
    def build(cls, cfg, server):
        if not cfg.dlg_eval:
            return None
        from utils.privacy_monitor import PrivacyMonitor

        return cls(PrivacyMonitor(cfg, server.run, server.data, server.recorder))

    def __init__(self, monitor):
        self.monitor = monitor

    def before_training(self, server, active):
        self.monitor.before_training(server.round_idx, active)

    def on_uploads(self, server, active, uploads):
        self.monitor.after_upload(server.round_idx, active, uploads)
        return uploads
