"""The server side of fine-tuned evaluation (clients/finetune.py): the ``-fte`` flag and a payload that carries
the round being opened."""
from flcore.servers.serverbase import Declares
from utils.errors import FLError


class FineTunedEvalServer:
    """The server side of ``FineTunedEval`` (clients/finetune.py), for every algorithm whose clients are
    evaluated on a fine-tuned copy: the ``-fte`` flag (default ``fte_default``) and a payload that carries
    the round, whose (``-ld``-decayed) rate the fine-tune uses."""
    fte_default = 1
    declares = Declares(
        pfllib_defaults={"fine_tuning_epochs": 10},
    )
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
