"""FedGen: Data-Free Knowledge Distillation for Heterogeneous Federated Learning.
Zhu, Hong, Zhou. ICML 2021. https://arxiv.org/abs/2105.10056
Official code: https://github.com/zhuangdizhu/FedGen

Relative to FedAvg the server also learns a generator G_w(z | y) of samples in feature space (the input of
the classifier ``fc``; the model is cut by ``flcore.trainmodel.parts.split_head``), and clients learn
from it. After each round's uploads, with n_k(y) the label counts client k sends (``Upload.extras``),
shares a_k(y) = n_k(y) / sum_j n_j(y) and p(y) proportional to sum_k n_k(y), the server takes ``-se``
Adam steps on

    J(w) = E_{y ~ p, eps ~ U[0,1)^d} CE( sum_k a_k(y) h_k(G_w(eps, y)), y ) + eta * L_div,
    L_div = exp( -mean_{i,j} ||eps_i - eps_j||^2 / d * |G_i - G_j|_1 / m )   (m: feature size),

the cross-entropy of the label-share-weighted ensemble of the uploaded heads h_k (the paper's server
objective, its ensemble weighted per label by the clients' label counts) plus the official code's
diversity loss (weight eta = 1). The model is then FedAvg's sample-weighted mean. The generator goes
down with the global model; a client's local objective becomes

    CE(h(f(x)), y) + alpha_t * E_{y' ~ p, z ~ G_w(. | y')} CE(h(z), y'),   alpha_t = max(1e-4, alpha 0.98^t),

so only the head h learns from generated features (the paper's local objective, with the official
code's schedule of alpha). The generator is frozen on clients (no client optimizer holds it); it is
trained on the server alone. In round 0 there is no trained generator yet and clients train as in FedAvg
(the official code regularises from round 1 on).

Where the official code differs from the objectives as the paper writes them: its teacher loss is the
label-share-weighted sum of each head's cross-entropy rather than the ensemble's; it draws labels
uniformly over the labels seen (server and clients) rather than from p(y); its clients add a KL term
between the outputs on real data and on generated features of the same labels (``generative_beta``; not
done here) and scale the generated-feature term by gen_batch_size / batch_size (1 at its defaults, 32 and
32). Here the term has the paper's weight alpha_t alone, whatever -lbs (the official weighting at -lbs 10:
``--generative_alpha`` 32, i.e. 10 x 32 / 10). Generator: the official MLP ([eps, onehot(y)] -> hidden -> BatchNorm -> ReLU -> feature),
Adam with weight decay 1e-2 and its rate decayed by 0.98 per round.

Flags (defaults: the official code's MNIST configuration; PFLlib's in brackets): ``-nd`` noise dimension d
= 32 [512]; ``-glr`` generator learning rate = 3e-4 [0.005]; ``-hd`` generator hidden size = 256 [512];
``-se`` generator steps per round = 50 [1000]; ``-lf`` keep feature extractors local, share only the head
(PFLlib's option; the clients' models then differ, a personalised variant) = off [off, but PFLlib's ``type=bool``
reads "False" as on]; ``--generative_alpha`` alpha = 10 [PFLlib: weight 1, no decay];
``--diversity_weight`` eta = 1 [PFLlib: no diversity loss]; ``--gen_batch_size`` generated samples per
client step and per generator step = 32 [PFLlib: -lbs]. PFLlib also trains from round 0 with an untrained
generator, draws the server's labels from every client's data whether it took part or not, and weights the
ensemble by sample counts rather than per-label shares.

``-ala`` works on the global model (refused with ``-lf``, where only the head is global). ``-dp`` is
refused: the label counts a client uploads are statistics of its data that DP-SGD does not privatise.

Verified (tests/test_fedgen.py): J(w) by hand on a toy ensemble, the generator trained on the server only,
the client objective and its schedule. Scale: 5 rounds of the 5-client IID Digits split at -lr 0.1 reach
0.93 (FedAvg 0.90); the paper's results are not reproduced here.
"""
import copy

import torch
from torch.nn import functional as F

from flcore.clients.clientgen import FedGenClient, Generator
from flcore.servers.serverbase import Declares, Server
from flcore.trainmodel.parts import split_head
from utils.dp_support import DPSupport
from utils.errors import FLError
from utils.seeding import torch_gen, torch_seeded

GEN_WEIGHT_DECAY, GEN_LR_DECAY = 1e-2, 0.98  # the official code's generator optimizer (Adam) and schedule


def diversity_loss(eps: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """exp(-mean_{i,j} d_eps(i, j) d_z(i, j)): d_eps the mean squared and d_z the mean absolute difference
    of rows i and j (the official code's diversity loss, after mode-seeking GANs)."""
    d_eps = (eps[:, None] - eps[None]).pow(2).mean(-1)
    d_z = (z[:, None] - z[None]).abs().flatten(2).mean(-1)
    return torch.exp(-(d_eps * d_z).mean())


def generator_loss(z, eps, y, heads, shares: torch.Tensor, eta: float) -> torch.Tensor:
    """J(w) on one batch: CE of the ensemble sum_k a_k(y) h_k(z) plus eta * diversity. ``shares``: K x C,
    a_k(y) = n_k(y) / sum_j n_j(y); ``heads``: the K uploaded classifiers."""
    logits = sum(shares[k, y][:, None] * head(z) for k, head in enumerate(heads))
    return F.cross_entropy(logits, y) + eta * diversity_loss(eps, z)


class FedGenServer(Server):
    # its row in docs/algorithms.md (written by python scripts/dev/docs_tables.py)
    table_row = dict(
        paper="Zhu, Hong, Zhou, ICML 2021, [arXiv 2105.10056](https://arxiv.org/abs/2105.10056)",
        family=("traditional FL, the server fits a label-conditioned generator of features to the "
                "label-share-weighted ensemble of uploaded heads (+ diversity loss) and sends it from round 1; "
                "clients add α·0.98^t CE of their head on generated features; `-dp` refused (label counts are "
                "uploaded)"),
        flags=("`-nd` 32, `-glr` 3e-4, `-hd` 256, `-se` 50, `-lf` off, `--generative_alpha` 10, "
               "`--diversity_weight` 1, `--gen_batch_size` 32 (official code)"),
        ala="yes (not with `-lf`): the local model")
    declares = Declares(
        client_class=FedGenClient,
        pfllib_defaults={"noise_dim": 512, "generator_learning_rate": 0.005, "hidden_dim": 512, "server_epochs": 1000},
        personalized=False,
        # --aggregator: the generator is trained on every uploaded head and label count, outside the rule
        robust_refusal="its server trains the generator on every uploaded head and label count, outside the rule",
        dp_support=DPSupport(  # -dp: what it refuses and what its epsilon leaves out (docs/privacy.md)
            refusal="it uploads each client's label counts",
        ),
    )

    @classmethod
    def add_args(cls, parser) -> None:
        super().add_args(parser)
        parser.add_argument("-nd", "--noise_dim", type=int, default=32,
                            help="generator noise dimension (official MNIST config: 32; PFLlib: 512)")
        parser.add_argument("-glr", "--generator_learning_rate", type=float, default=3e-4,
                            help="generator Adam learning rate (official MNIST config: 3e-4; PFLlib: 0.005)")
        parser.add_argument("-hd", "--hidden_dim", type=int, default=256,
                            help="generator hidden size (official MNIST config: 256; PFLlib: 512)")
        parser.add_argument("-se", "--server_epochs", type=int, default=50,
                            help="generator steps per round (official code: 50; PFLlib: 1000)")
        parser.add_argument("-lf", "--localize_feature_extractor", action="store_true",
                            help="share only the classifier; feature extractors stay local")
        parser.add_argument("--generative_alpha", type=float, default=10.0,
                            help="weight alpha of the generated-sample loss, decayed 0.98 per round (official: 10)")
        parser.add_argument("--diversity_weight", type=float, default=1.0,
                            help="weight eta of the generator's diversity loss (official: 1)")
        parser.add_argument("--gen_batch_size", type=int, default=32,
                            help="generated samples per client step and per generator step (official: 32)")

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        if cfg.ala and cfg.localize_feature_extractor:
            raise FLError("-ala initialises a whole local model from the global one; with -lf only the head is "
                          "global, so drop -ala or -lf")
        if min(cfg.noise_dim, cfg.hidden_dim, cfg.gen_batch_size) < 1 or cfg.server_epochs < 0:
            raise FLError("FedGen needs -nd, -hd and --gen_batch_size >= 1 and -se >= 0")
        if cfg.generator_learning_rate <= 0 or cfg.generative_alpha < 0 or cfg.diversity_weight < 0:
            raise FLError("FedGen needs -glr > 0, --generative_alpha >= 0 and --diversity_weight >= 0")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        with torch_seeded(cfg.seed, self.run, "fedgen-generator"):
            self.generator = Generator.for_model(cfg, self.global_model, self.data.clients[0].x_train[:1],
                                                 self.data.num_classes)
        self.generator.to(self.device)
        self.gen_optimizer = torch.optim.Adam(self.generator.parameters(), lr=cfg.generator_learning_rate,
                                              weight_decay=GEN_WEIGHT_DECAY)
        self.gen_stream = torch_gen(cfg.seed, self.run, "fedgen-server", device=cfg.device)
        self.gen_rounds = 0  # rounds the generator has been trained in
        self.label_dist: torch.Tensor | None = None  # p(y) from the last uploads' label counts

    def build_model(self):
        return split_head(super().build_model())

    def broadcast(self, client):
        trained = self.gen_rounds > 0
        return {"model": self.global_model, "generator": self.generator if trained else None,
                "label_dist": self.label_dist}

    def train_generator(self, uploads) -> None:
        """``-se`` Adam steps on J(w) against the round's uploaded heads and label counts."""
        heads = []
        for u in uploads:
            head = copy.deepcopy(self.global_model.head).eval()
            head.load_state_dict({k[5:]: v for k, v in u.state.items() if k.startswith("head.")})
            heads.append(head.requires_grad_(False))
        counts = torch.stack([u.extras["label_counts"].to(self.device) for u in uploads])  # K x C
        total = counts.sum(0)
        shares = counts / total.clamp(min=1)
        self.label_dist = total / total.sum()
        for group in self.gen_optimizer.param_groups:
            group["lr"] = self.cfg.generator_learning_rate * GEN_LR_DECAY ** self.gen_rounds
        self.generator.train()
        for _ in range(self.cfg.server_epochs):
            eps, y, z = self.generator.sample(self.label_dist, self.cfg.gen_batch_size, self.gen_stream)
            loss = generator_loss(z, eps, y, heads, shares, self.cfg.diversity_weight)
            self.gen_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.gen_optimizer.step()
        self.generator.eval()
        self.gen_rounds += 1

    def aggregate(self, uploads) -> None:
        if not uploads:
            return
        self.train_generator(uploads)
        if not self.cfg.localize_feature_extractor:
            return super().aggregate(uploads)
        self.average_uploads(uploads, self.global_model.head, prefix="head.")
