"""FedBABU: Toward Enhanced Representation for Federated Image Classification.
Oh, Kim, Yun. ICLR 2022. https://arxiv.org/abs/2106.06042   Official code: https://github.com/jhoon-oh/FedBABU

Relative to FedAvg this changes two things. (1) During federated training only the body (``base``) is
trained and shared: the head (``head``, the classifier; ``flcore.trainmodel.parts.split_head``) keeps its
random initialisation, identical on every client, and is never updated nor sent (the paper's head
learning rate is 0):

    φ_i ← SGD^{ls}(φ; h⁰ fixed, D_i),   φ ← Σ_i (n_i / Σ_j n_j) φ_i.

(2) Each client is evaluated on a copy of the received model whose whole network (body and head, the
paper's personalization) is fine-tuned for ``-fte`` epochs on its own training data (SGD, batch ``-lbs``,
cross-entropy, at the rate local training has in that round: ``-lr``, decayed with ``-ld``). The copy is
made at each evaluation from the model just received and thrown away: it is never uploaded nor trained
on, and its batches (and, with ``-dp``, its noise) come from the client's own fine-tune streams, so the
federated run is the same with or without evaluation.

Flags: ``-fte`` fine-tuning epochs = 5 (the paper's τ_f for its personalized accuracy, the official
code's ``--ft_ep`` default; PFLlib's default is 10). PFLlib fine-tunes once, after the last round, in
place; here every evaluation fine-tunes a copy, so every evaluation reports personalized accuracy.
``-ala``: the received body is initialised by ALA under the common head (its top ``-p`` layers adapted);
the fine-tune then starts from that model. ``-dp``: training is DP-SGD (the base loop) and so is the
evaluation fine-tune, whose steps the client's accountant counts: they read the training data, and the
evaluated accuracy leaves the client. Epsilon therefore grows with every evaluation (``-eg``).
"""
from flcore.clients.clientbabu import FedBABUClient
from flcore.servers.finetune import FineTunedEvalServer
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares


class FedBABUServer(FineTunedEvalServer, PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Oh, Kim, Yun, ICLR 2022, [arXiv 2106.06042](https://arxiv.org/abs/2106.06042)",
        family=("pFL, body-only federated training under the fixed initial head; every evaluation fine-tunes a "
                "copy of the whole model (own batch stream; DP-SGD and counted with `-dp`)"),
        flags="`-fte` 5 (paper, official code; PFLlib 10)",
        ala="yes: the body, under the common head; the fine-tune starts from it")
    declares = Declares(
        client_class=FedBABUClient,
    )
    fte_default = 5
    fte_help = ("epochs each client fine-tunes its copy of the model before evaluation (FedBABU paper: 5; PFLlib: 10); "
                "the head is trained only by this fine-tune")
