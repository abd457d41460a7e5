"""FedRoD: On Bridging Generic and Personalized Federated Learning for Image Classification.
Chen, Chao. ICLR 2022. https://arxiv.org/abs/2107.00778   Official code: https://github.com/hongyouc/Fed-RoD

Relative to FedAvg this changes the local objective and adds a personal head. The model is a body φ
(``base``), a generic head h_G (``head``; ``flcore.trainmodel.parts.split_head``) and a personal head h_P
(``phead``) on the same features z = φ(x). Each local step on a batch of client i:

    φ, h_G ← SGD on BSM(h_G(z), y) = CE(h_G(z) + log n_i,c, y)     (balanced softmax, n_i,c: the
                                                                     client's count of class c)
    h_P    ← SGD on CE(sg[h_G(z)] + h_P(sg[z]), y)                 (sg: stop-gradient)

and the server averages φ and h_G, sample-weighted (the generic model); h_P never leaves the client.
The personalized prediction is h_G(z) + h_P(z): each client is evaluated on it. The balanced softmax
makes the generic head's local objective an estimate of the class-balanced risk, the same on every
client; a class absent from a client's data (n_c = 0) gets log n_c = -inf, so that client neither
raises nor lowers it. The two updates use disjoint parameters, so they are one SGD step on the summed
loss (``FedRoDClient.loss``). This is the paper's linear personal head (PFLlib's FedRoD), not its
hypernetwork variant; h_P starts as a copy of the initial head, as in PFLlib.

No flags of its own (the personal head uses ``-lr``). ``-ala``: the received body and generic head are
initialised by ALA under the client's own personal head (the top ``-p`` layers of body + generic head
are adapted, the loss that of the personalized prediction). ``-dp``: the summed loss is the DP-SGD
objective, per-sample gradients of all three parts clipped together; the label counts in the generic
head's balanced softmax are not privatised (``dp_support.uncovered``: a warning at start-up).
"""
from flcore.clients.clientrod import FedRoDClient, RoDModel
from flcore.servers.partsharing import PartSharingServer
from flcore.servers.serverbase import Declares
from utils.dp_support import DPSupport


class FedRoDServer(PartSharingServer):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Chen & Chao, ICLR 2022, [arXiv 2107.00778](https://arxiv.org/abs/2107.00778)",
        family=("pFL, body + generic head trained with the balanced softmax (logits + log n_c) and averaged; "
                "local personal head trained on generic + personal logits (features and generic logits detached); "
                "predicts with the sum"),
        flags="—",
        ala="yes: body + generic head, adapted under the personal head")
    declares = Declares(
        client_class=FedRoDClient,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            uncovered=("FedRoD's balanced-softmax loss, which reads the client's label counts (a statistic of all its "
                       "data) in every sample's loss"),
        ),
    )

    def build_model(self):
        return RoDModel(super().build_model())  # phead: never updated on the server
