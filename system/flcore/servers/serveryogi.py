"""FedYogi: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. Adaptive Federated Optimization.
ICLR 2021. https://arxiv.org/abs/2003.00295

FedAvg with ``--server_opt yogi`` (plugins/optimizers.py), which any averaging algorithm takes: clients train as
in FedAvg and the server, instead of taking the sample-weighted mean Θ̄ as the new model, applies Yogi on the
pseudo-gradient g = Θ - Θ̄ (Θ̄ the round's aggregate): m <- β1 m + (1 - β1) g, v <- v - (1 - β2) g² sign(v -
g²), Θ <- Θ - η m / (√v + τ). Only parameters are stepped; BatchNorm statistics take the aggregate. The
optimizer's state lives on the server and is checkpointed with it.

Flags (the common server-optimizer flags, with this algorithm's defaults): ``-slr`` η = 0.01,
``--server_momentum`` β1 = 0.9, ``--server_beta2`` β2 = 0.99, ``--server_tau`` τ = 1e-3; every one can be
changed.
"""
from flcore.clients.clientyogi import FedYogiClient
from flcore.servers.serveravg import FedAvgServer
from flcore.servers.serverbase import Declares


class FedYogiServer(FedAvgServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Reddi et al., ICLR 2021, [arXiv 2003.00295](https://arxiv.org/abs/2003.00295)",
        family="traditional FL, server Yogi on the pseudo-gradient (FedAvg + `--server_opt yogi`)",
        flags="`-slr` η 0.01, `--server_momentum` β1 0.9, `--server_beta2` β2 0.99, `--server_tau` τ 0.001",
        ala="yes: the local model")
    declares = Declares(
        client_class=FedYogiClient,
    )

    @classmethod
    def add_args(cls, parser) -> None:
        parser.set_defaults(server_opt="yogi")
