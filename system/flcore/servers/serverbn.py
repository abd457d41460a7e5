"""FedBN: Federated Learning on Non-IID Features via Local Batch Normalization.
Li, Jiang, Zhang, Kamp, Dou. ICLR 2021. https://arxiv.org/abs/2102.07623
Official code: https://github.com/med-air/FedBN

Relative to FedAvg this changes what is shared: every BatchNorm layer stays on its client, its affine
parameters (γ, β) and its running statistics (mean, variance, batch count) alike. Everything else is
FedAvg's sample-weighted mean (Algorithm 1 of the paper):

    w^{t+1}_l = Σ_i (n_i / Σ_j n_j) w^t_{i,l}  for every non-BatchNorm entry l;  BatchNorm entries of client i
    stay client i's.

Clients are evaluated on their own models (their BatchNorm layers under the shared rest). BatchNorm
layers are found by module type (``torch.nn.modules.batchnorm._BatchNorm``), not by the substring
'bn' in a name, which misses torchvision's ``downsample.1`` (PFLlib's filter, so PFLlib's FedBN on
ResNet-18 averages those). PFLlib keeps BatchNorm statistics local for *every* algorithm (it averages and
sends parameters only); here every other algorithm averages them (``--bn_stats shared``, the default)
and FedBN keeps the whole layer local whatever ``--bn_stats`` says.

The model needs BatchNorm: ``-m BNCNN`` (the 4-layer CNN with BatchNorm after each convolution) or
``-m ResNet18``; ``-m auto`` picks ``BNCNN`` where it would pick the CNN (images without another default
model). On a model without BatchNorm FedBN would be FedAvg, so it stops with an error instead. With ``-ala`` ALA initialises the shared entries from the
global model (its ``-p`` top layers blended), the BatchNorm layers staying the client's.
``-dp`` is refused: DP-SGD needs per-sample gradients, which BatchNorm does not have.

Flags: none of its own (PFLlib: none).
"""
from flcore.clients.clientbn import FedBNClient, bn_prefixes
from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.models import build_model, resolve
from utils.dp_support import DPSupport
from utils.errors import FLError


class FedBNServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Li et al., ICLR 2021, [arXiv 2102.07623](https://arxiv.org/abs/2102.07623)",
        family=("pFL, BatchNorm layers (parameters and statistics) stay local, found by module type (ResNet's "
                "`downsample.1` included); a model without BatchNorm is refused; `-dp` refused"),
        flags="— (`-m auto` = BNCNN)",
        ala="yes: the shared entries, under the client's own BatchNorm layers")
    declares = Declares(
        client_class=FedBNClient,
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal="its BatchNorm layers have no per-sample gradients",
        ),
    )

    def build_model(self):
        shape, config = self.data.input_shape, self.data.config
        if self.cfg.model == "auto" and resolve("auto", shape, config) == "CNN":  # its BatchNorm twin instead
            model = build_model("BNCNN", shape, self.data.num_classes, self.cfg.feature_dim, config=config)
        else:
            model = super().build_model()
        if not bn_prefixes(model):
            raise FLError(f"FedBN keeps BatchNorm layers local, but -m {self.cfg.model} has none (FedBN would be "
                          f"FedAvg); use -m BNCNN or -m ResNet18")
        return model

    def aggregate(self, uploads) -> None:
        """Sample-weighted mean of the uploaded (non-BatchNorm) entries; the global model's BatchNorm
        entries are never used by the clients and stay as initialised."""
        if uploads:
            self.average_uploads(uploads)
