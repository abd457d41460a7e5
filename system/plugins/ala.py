"""``-ala``: adaptive local aggregation (FedALA), pluggable into any algorithm. Each client initialises its local
model from what it receives by ALA (utils/ALA.py) in ``Client.initialize_local``, the one place a local model
is initialised, so every algorithm whose client receives through it gets "+ALA"; an algorithm that cannot
take it refuses ``-ala`` in its ``check_config``."""
from __future__ import annotations

from plugins import Plugin


class AdaptiveLocalAggregation(Plugin):
    @classmethod
    def add_flags(cls, parser) -> None:
        g = parser.flag_group("ALA (adaptive local aggregation, pluggable into any algorithm)")
        g.add_argument("-ala", "--ala", action="store_true", help="initialise local models with ALA")
        g.add_argument("-et", "--eta", type=float, default=1.0, help="ALA weight learning rate η (paper: 1.0)")
        g.add_argument("-s", "--rand_percent", type=int, default=80, help="s: %% of local data for ALA (paper: 80)")
        g.add_argument("-p", "--layer_idx", type=int, default=2,
                       help="ALA adapts the last p parameter tensors, counted as PFLlib counts them (2 = the "
                            "classifier's weight and bias: the paper's p = 1 layer); 0 = all")
        g.add_argument("--ala_layers", type=int, default=None,
                       help="count ALA's p in layers as the FedALA paper does (1 = the classifier; a norm layer joins "
                            "the layer below, a ResNet stage is one layer); given, it replaces -p (default: unset, -p counts)")
        g.add_argument("--ala_threshold", type=float, default=0.1,
                       help="start phase stops when the std of the last --ala_window losses is below this")
        g.add_argument("--ala_window", type=int, default=10, help="number of recent ALA losses in the std")
        g.add_argument("--ala_max_epochs", type=int, default=100, help="cap on start-phase ALA epochs")
        g.add_argument("--ala_clients", default="selected", choices=["selected", "all"],
                       help="who runs ALA on each broadcast: the round's selected clients (the others are evaluated "
                            "on their own last model) or every client, before every evaluation (PFLlib; with -jr < 1 "
                            "ALA then costs N clients per round instead of jr*N)")

    @classmethod
    def build(cls, cfg, server):
        """Nothing acts on the server's side; it says once which tensors the clients adapt."""
        ala = server.clients[0].ala if server.clients else None
        if ala is not None:
            count = (f"top {cfg.ala_layers or 'all'} layer(s)" if cfg.ala_layers is not None
                     else f"last {cfg.layer_idx or 'all'} tensor(s), -p")
            print(f"ALA adapts {len(ala.names)} tensor(s) ({count}): {', '.join(ala.names)}")
        return None
