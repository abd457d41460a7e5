"""FedAvg: Communication-Efficient Learning of Deep Networks from Decentralized Data.
McMahan, Moore, Ramage, Hampson, Agüera y Arcas. AISTATS 2017. https://arxiv.org/abs/1602.05629

The reference point: each round the participants start from the global model, run ``-ls`` epochs of SGD
(lr ``-lr``, batch ``-lbs``) on their data, and the server replaces the global model by the
sample-weighted mean of their models, Θ ← Σ_i (n_i / Σ_j n_j) Θ_i, over every floating state entry
(PFLlib averages parameters only, leaving BatchNorm statistics local). No flags of its own.
Everything is the base classes' behaviour; this pair only names it.
"""
from flcore.clients.clientavg import FedAvgClient
from flcore.servers.serverbase import Declares, Server


class FedAvgServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="McMahan et al., AISTATS 2017, [arXiv 1602.05629](https://arxiv.org/abs/1602.05629)",
        family="traditional FL",
        flags="—",
        ala="yes: `FedAvg -ala` is FedALA, number for number")
    declares = Declares(
        client_class=FedAvgClient,
        personalized=False,
    )
