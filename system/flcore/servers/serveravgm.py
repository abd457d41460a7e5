"""FedAvgM: Hsu, Qi, Brown. Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification. arXiv 2019. https://arxiv.org/abs/1909.06335

FedAvg with ``--server_opt avgm`` (plugins/optimizers.py), which any averaging algorithm takes: clients train as
in FedAvg and the server, instead of taking the sample-weighted mean Θ̄ as the new model, applies server
momentum: m <- β1 m + g, Θ <- Θ - η m, with g = Θ - Θ̄ (Θ̄ the round's aggregate). Only parameters are
stepped; BatchNorm statistics take the aggregate. The optimizer's state lives on the server and is
checkpointed with it.

Flags (the common server-optimizer flags, with this algorithm's defaults): ``-slr`` η = 1 and
``--server_momentum`` β1 = 0.9 (the paper's server learning rate 1 and momentum 0.9); every one can be
changed.
"""
from flcore.clients.clientavgm import FedAvgMClient
from flcore.servers.serveravg import FedAvgServer
from flcore.servers.serverbase import Declares


class FedAvgMServer(FedAvgServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Hsu, Qi, Brown, 2019, [arXiv 1909.06335](https://arxiv.org/abs/1909.06335)",
        family="traditional FL, server momentum on the pseudo-gradient (FedAvg + `--server_opt avgm`)",
        flags="`-slr` η 1.0, `--server_momentum` β 0.9",
        ala="yes: the local model")
    declares = Declares(
        client_class=FedAvgMClient,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.set_defaults(server_opt="avgm")
