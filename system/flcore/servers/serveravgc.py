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
from flcore.servers.serverbase import Server
from utils.errors import FLError


class FineTunedEvalServer:
    """The server side of ``FineTunedEval`` (clients/clientavgc.py), for every algorithm whose clients are
    evaluated on a fine-tuned copy: the ``-fte`` flag (default ``fte_default``) and a payload that carries
    the round, whose (``-ld``-decayed) rate the fine-tune uses."""
    fte_default = 1
    fte_help = "epochs each client fine-tunes its copy of the global model before evaluation (the FedALA paper names no value; 1 here)"

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-fte", "--fine_tuning_epochs", type=int, default=cls.fte_default, help=cls.fte_help)

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.fine_tuning_epochs < 1:
            raise FLError(f"-fte must be >= 1 (got {cfg.fine_tuning_epochs})")

    def broadcast(self, client):
        """What the server beside it sends (the global model; FedBABU: its shared body) and the round it opens
        (the fine-tuning rate is that round's, with ``-ld``)."""
        return {"model": super().broadcast(client), "round": self.round_idx}


class FedAvgCServer(FineTunedEvalServer, Server):
    client_class = FedAvgCClient
