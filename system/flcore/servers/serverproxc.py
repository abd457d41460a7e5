"""FedProx-C: FedProx whose global model each client fine-tunes locally before it is evaluated.

A baseline of the FedALA paper (Zhang et al., AAAI 2023, https://arxiv.org/abs/2212.01197, Table 2).
Federated part: FedProx (Li et al., MLSys 2020, https://arxiv.org/abs/1812.06127, servers/serverprox.py);
evaluation part: fine-tuned evaluation (clients/finetune.py, as FedAvg-C). The fine-tuning is plain
cross-entropy SGD, without the proximal term: it personalises, it is not part of the federated optimisation.

Relative to FedAvg this changes the local objective (FedProx's proximal term) and evaluation (a copy
fine-tuned ``-fte`` epochs). Flags: ``-mu`` = 0.01 and ``-fte`` = 1, as for FedProx and FedAvg-C.
"""
from flcore.clients.clientproxc import FedProxCClient
from flcore.servers.finetune import FineTunedEvalServer
from flcore.servers.serverbase import Declares
from flcore.servers.serverprox import FedProxServer


class FedProxCServer(FineTunedEvalServer, FedProxServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="FedProx fine-tuned per client, as in FedALA (AAAI 2023)",
        family="traditional FL + local fine-tuning",
        flags="`-mu` 0.01, `-fte` 1",
        ala="yes: as FedProx; the fine-tuned copy starts from the local model")
    """Flags and checks of both parents (cooperative ``super()`` in ``add_args``/``check_config``)."""
    declares = Declares(
        client_class=FedProxCClient,
        personalized=True,  # FedProx's training, evaluated after local fine-tuning
    )
