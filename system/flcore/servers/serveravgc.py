"""FedAvg-C: FedAvg whose global model each client fine-tunes locally before it is evaluated.

A baseline of the FedALA paper (Zhang et al., AAAI 2023, https://arxiv.org/abs/2212.01197, Table 2),
where FedAvg-C and FedProx-C are the locally fine-tuned versions of FedAvg and FedProx; the paper gives no
fine-tuning schedule, so ``-fte`` sets it. Federated part: McMahan et al., AISTATS 2017,
https://arxiv.org/abs/1602.05629.

Relative to FedAvg this changes only evaluation: client i is evaluated on v_i = SGD^{fte}(Θ; D_i), a copy
of the received model Θ trained ``-fte`` epochs on its own training data. v_i is never uploaded nor
reused, so the global models Θ^t are FedAvg's, number for number; only the personalised accuracy
differs. With ``-ala`` the copy starts from the ALA-initialised local model. The fine-tuning runs at the
rate of the round being evaluated (``-lr``, times ``-ldg``^round with ``-ld``).

Flags: ``-fte`` fine-tuning epochs = 1 (PFLlib's ``-fte`` name, which it uses for FedBABU).
"""
from flcore.clients.clientavgc import FedAvgCClient
from flcore.servers.finetune import FineTunedEvalServer
from flcore.servers.serverbase import Declares, Server


class FedAvgCServer(FineTunedEvalServer, Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper=("FedAvg (McMahan et al., AISTATS 2017) fine-tuned per client, as in FedALA (Zhang et al., AAAI "
               "2023, [arXiv 2212.01197](https://arxiv.org/abs/2212.01197))"),
        family="traditional FL + local fine-tuning",
        flags="`-fte` 1",
        ala="yes: the local model; the fine-tuned copy starts from it")
    declares = Declares(
        client_class=FedAvgCClient,
    )
