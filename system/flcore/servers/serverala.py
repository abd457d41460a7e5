"""FedALA: Adaptive Local Aggregation for Personalized Federated Learning.
Zhang, Hua, Wang, Song, Xue, Ma, Guan. AAAI 2023. https://arxiv.org/abs/2212.01197
Official code: https://github.com/TsingZ0/FedALA

Relative to FedAvg this changes only the client's local initialisation: instead of overwriting its model
with the global model Θ, each participant initialises Θ̂_i = Θ_i + (Θ − Θ_i) ⊙ [1 ; W_i^p] with learned
element-wise weights W (utils/ALA.py). Training, upload (one model) and server aggregation are FedAvg's,
so FedALA == FedAvg with ``-ala``, number for number.

Flags (shared with ``-ala``): ``-et`` η = 1.0, ``-s`` s = 80, ``-p`` 2 tensors = the classifier's weight and bias = the paper's p = 1 layer (``--ala_layers`` counts layers as the paper; the paper's defaults),
``--ala_threshold`` 0.1, ``--ala_window`` 10, ``--ala_max_epochs`` 100.

Where PFLlib differs: it runs ALA on every client every round (the paper: the round's participants;
identical when ``-jr 1``), samples D_i^s as an unseeded contiguous window and has
no cap on the start phase (see utils/ALA.py for the full list).
"""
from flcore.clients.clientala import FedALAClient
from flcore.servers.serverbase import Declares, Server
from utils.dp_support import ALA_UNCOVERED, DPSupport


class FedALAServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhang et al., AAAI 2023, [arXiv 2212.01197](https://arxiv.org/abs/2212.01197)",
        family="pFL, adaptive local aggregation",
        flags=("`-et` η 1.0, `-s` 80, `-p` 2 tensors (the classifier: the paper's p = 1; or `--ala_layers` 1), "
               "`--ala_threshold` 0.1, `--ala_window` 10, `--ala_max_epochs` 100"),
        ala="built in")
    declares = Declares(
        client_class=FedALAClient,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            uncovered=ALA_UNCOVERED,
        ),
    )
