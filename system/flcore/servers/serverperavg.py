"""Per-FedAvg: Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach. Fallah, Mokhtari, Ozdaglar. NeurIPS 2020. https://arxiv.org/abs/2002.07948
No official code; PFLlib's ``PerAvg`` is the common reference.

Relative to FedAvg this changes the client's local step and its evaluation. Training (first-order
variant, Per-FedAvg (FO)): for each pair of fresh batches D, D',

    w' = w - α ∇f_i(w; D),    w ← w - β ∇f_i(w'; D'),

and the server averages the w's as FedAvg does. Evaluation uses the paper's personalisation: one step
w - α ∇f_i(w; D) on a local training batch, made on a copy (the federated state is untouched), with the
α of the round being evaluated.

Flags: α = ``-lr``; ``-bt`` β, by default equal to α (what PFLlib runs: it steps with β = ``-lr``; an
unset ``-bt`` is recorded as null in the run's config). With ``-ld`` α and β both decay by γ per round, and the evaluation's step uses the decayed α of its
round, as training does (the server sends the round with the model). The Hessian-free variant (HF) is
not implemented.

``-dp``: privatised step by step. Each meta-step's two gradients are DP-SGD releases on their own half of
the batch (∇f(w; D) and ∇f(w'; D'), each clipped per sample and noised, two accountant steps per
meta-step), and the evaluation's personalisation step is one more release on its batch (counted too, so
epsilon grows with every evaluation). The FO-MAML loss of one batch is not privatised as a whole: its inner
gradient mixes the samples of D, so a per-sample gradient of it is undefined.

PFLlib takes the same FO step (it restores w before the β step, since June 2021) and personalises the
same way (one α step on a training batch, since February 2023). Where it differs:
- it ignores ``-bt``: β is the initial ``-lr`` and stays fixed under ``-ld``, while α decays by γ after
  each local training (twice a round, see below). Here ``-bt`` sets β. The β = 0.001 once used here,
  which PFLlib users still pass to no effect, comes from the pFedMe repository's Per-FedAvg runs
  (with ``-lr`` 0.005); it barely moves the model (Digits, 5 IID clients, 20 rounds at ``-lr`` 0.005:
  accuracy 0.12, against 0.49 with β = ``-lr``).
- its server runs each client's training twice per round, so that a round uses as many batches as
  FedAvg's: one ``-ls`` epoch there is two passes of n / (2 ``-lbs``) meta-steps (it drops the last
  partial batch), here one pass of ceil(n / (2 ``-lbs``)) (``steps_per_round``). ``-ls 2`` here takes
  about as many meta-steps as PFLlib's ``-ls 1``.
"""
import sys

from flcore.clients.clientperavg import PerFedAvgClient
from flcore.servers.serverbase import Declares, Server
from utils.errors import FLError


class PerFedAvgServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Fallah et al., NeurIPS 2020, [arXiv 2002.07948](https://arxiv.org/abs/2002.07948)",
        family="pFL, meta-learning (first-order MAML)",
        flags="`-bt` β (default = `-lr`, PFLlib's effective β; α = `-lr`)",
        ala="yes: the meta-model w")
    declares = Declares(
        client_class=PerFedAvgClient,
        pfllib_defaults={"beta": 0.0},
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-bt", "--beta", type=float, default=None,
                            help="outer (meta) step size β; α is -lr (default: β = -lr, the step PFLlib "
                                 "takes, which ignores -bt)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.beta is not None and cfg.beta < 0:
            raise FLError(f"-bt must be > 0 (got {cfg.beta}); leave it out for β = -lr")
        if cfg.beta == 0:  # PFLlib's default, which its Per-FedAvg ignores: its command lines carry it
            print("warning: -bt 0 is PFLlib's default, which its Per-FedAvg ignores; β = -lr as there",
                  file=sys.stderr)

    def broadcast(self, client) -> dict:
        """The global model and the round it opens: the α of that round (``-ld``) is the step size of
        the personalisation before the round's evaluation."""
        return {"model": self.global_model, "round": self.round_idx}
