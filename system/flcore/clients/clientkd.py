"""FedKD client: a personal mentor, the shared mentee (``self.model``) and the hidden-state map W_h, trained
together by adaptive mutual distillation; the mentee's update goes up SVD-compressed and the global update
comes down compressed the same way (see servers/serverkd.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from flcore.clients.clientbase import Client, ClientDeclares, Upload
from flcore.trainmodel.parts import head_of


def energy_threshold(t_start: float, t_end: float, round_idx: int, rounds: int) -> float:
    """T(t) = T_start + (T_end - T_start) (t + 1) / R for round t = 0 .. R-1: the paper's dynamic threshold
    with rounds counted from 1, as the official code does, so the last round compresses at T_end."""
    return t_start + (t_end - t_start) * (round_idx + 1) / max(rounds, 1)


def svd_compress(matrix: torch.Tensor, energy: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U_k, σ_k, V_k) of ``matrix`` (m x n) ≈ U_k diag(σ_k) V_k: the fewest singular values whose energy
    Σ_{i<=k} σ_i² reaches ``energy`` of Σ_i σ_i² (k = 0 for a zero matrix). The dropped Frobenius² error is
    the sum of the dropped σ². Where LAPACK's single-precision SVD fails to converge (it does on some nearly
    rank-deficient fc-layer updates late in training: FMNIST Dir(0.1), 1,200 images, seed 1, round 142), the
    SVD is redone in double precision and its factors cast back; elsewhere the result is the float32 one."""
    try:
        u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    except torch.linalg.LinAlgError:  # a float64 matrix fails again here, and the error propagates
        u, s, vh = (f.to(matrix.dtype) for f in torch.linalg.svd(matrix.double(), full_matrices=False))
    cum = s.square().cumsum(0)
    k = min(int((cum < energy * cum[-1]).sum()) + 1, len(s)) if len(s) and cum[-1] > 0 else 0
    return u[:, :k].clone(), s[:k].clone(), vh[:k].clone()


def compress_state(update: dict[str, torch.Tensor], energy: float) -> dict:
    """Each entry of ``update``: a tensor of 2 or more dimensions, read as a matrix (first dimension x the
    rest, a conv kernel as out x in*kh*kw), becomes its (U, σ, V) factors when those are smaller than it;
    vectors and matrices too small to gain stay dense."""
    out = {}
    for name, t in update.items():
        if t.dim() >= 2:
            u, s, v = svd_compress(t.reshape(t.shape[0], -1), energy)
            if u.numel() + s.numel() + v.numel() < t.numel():
                out[name] = (u, s, v)
                continue
        out[name] = t.clone()
    return out


def decompress(entry, shape: torch.Size) -> torch.Tensor:
    """A dense tensor of ``shape`` from one entry of ``compress_state``."""
    if isinstance(entry, tuple):
        u, s, v = entry
        return ((u * s) @ v).reshape(shape)
    return entry.reshape(shape)


@torch.no_grad()
def apply_update(model: nn.Module, update: dict) -> None:
    """Add a compressed update to ``model``'s state, in place."""
    state = model.state_dict()
    for name, entry in update.items():
        state[name].add_(decompress(entry, state[name].shape).to(state[name]))


def shared_entries(model: nn.Module, buffers: bool) -> list[str]:
    """The mentee's entries that are exchanged: its parameters, and with ``buffers`` its floating buffers
    (BatchNorm statistics, unless --bn_stats local)."""
    names = [k for k, _ in model.named_parameters()]
    if buffers:
        names += [k for k, b in model.named_buffers() if b.is_floating_point()]
    return names


def hidden_and_logits(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the classifier's input, the logits) of ``model`` on ``x`` (the head contract: ``head_of``)."""
    seen = []
    hook = head_of(model).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        logits = model(x)
    finally:
        hook.remove()
    return seen[-1].flatten(1), logits


def adaptive_kd_losses(t_logits, s_logits, t_hidden, s_hidden, w_h: nn.Module, y):
    """(L_t, L_s): the mentor's and the mentee's losses, the distillation terms divided by the sum of both
    task losses (a weight, so no gradient through it), each model's KL target the other's detached
    prediction; the hidden loss trains the mentor toward W_h H_s, and the mentee and W_h toward H_t."""
    ce_t, ce_s = F.cross_entropy(t_logits, y), F.cross_entropy(s_logits, y)
    weight = 1.0 / (ce_t + ce_s).detach()
    log_t, log_s = F.log_softmax(t_logits, 1), F.log_softmax(s_logits, 1)
    kl_t = F.kl_div(log_t, log_s.detach(), reduction="batchmean", log_target=True)
    kl_s = F.kl_div(log_s, log_t.detach(), reduction="batchmean", log_target=True)
    mapped = w_h(s_hidden)
    mse_t = F.mse_loss(t_hidden, mapped.detach())
    mse_s = F.mse_loss(mapped, t_hidden.detach())
    return ce_t + weight * (kl_t + mse_t), ce_s + weight * (kl_s + mse_s)


class FedKDClient(Client):
    declares = ClientDeclares(
        dp_modules=("model", "mentor", "W_h"),  # -dp: the KD optimizer steps the mentee, the mentor and W_h
    )

    def __init__(self, *args, own_model: nn.Module | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # self.model is the mentee (received, trained, its update uploaded); the mentor is personal: with
        # --client_models this client's own architecture (``own_model``), else a copy of the mentee.
        self.mentor = copy.deepcopy(self.model if own_model is None else own_model)
        self.global_mentee = copy.deepcopy(self.model)  # the global mentee, as rebuilt from the downloads
        dims = []
        for m in (self.model, self.mentor):
            was = m.training
            m.eval()
            with torch.no_grad():
                dims.append(hidden_and_logits(m, self.x_train[:1])[0].shape[1])
            m.train(was)
        self.W_h = nn.Linear(*dims, bias=False).to(self.device)  # mentee hidden -> mentor hidden
        self.kd_optimizer = torch.optim.SGD([{"params": [*self.mentor.parameters(), *self.W_h.parameters()]},
                                             {"params": list(self.model.parameters())}],
                                            lr=self.cfg.local_learning_rate)
        self.trained_round = 0

    def receive(self, payload, participating: bool = True) -> None:
        apply_update(self.global_mentee, payload["update"])
        self.initialize_local(self.model, self.global_mentee, participating)

    def kd_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t_hidden, t_logits = hidden_and_logits(self.mentor, x)
        s_hidden, s_logits = hidden_and_logits(self.model, x)
        mentor, mentee = adaptive_kd_losses(t_logits, s_logits, t_hidden, s_hidden, self.W_h, y)
        return mentor + mentee

    def local_update(self, round_idx: int) -> None:
        lr = self.learning_rate(round_idx)
        mentee_lr = self.cfg.mentee_learning_rate or self.cfg.local_learning_rate
        self.kd_optimizer.param_groups[0]["lr"] = lr
        self.kd_optimizer.param_groups[1]["lr"] = mentee_lr * lr / self.cfg.local_learning_rate  # -ld too
        self.mentor.train()
        self.run_epochs(self.cfg.local_epochs, optimizer=self.kd_optimizer, objective=self.kd_loss)
        self.trained_round = round_idx

    def upload(self) -> Upload:
        """The mentee's update since the global mentee, SVD-compressed at this round's T(t)."""
        mine, start = self.model.state_dict(), self.global_mentee.state_dict()
        update = {k: mine[k] - start[k] for k in shared_entries(self.model, self.cfg.bn_stats == "shared")}
        energy = energy_threshold(self.cfg.T_start, self.cfg.T_end, self.trained_round, self.cfg.global_rounds)
        return Upload(self.id, self.train_samples, None, extras={"update": compress_state(update, energy)})

    def eval_model(self) -> nn.Module:
        return self.mentor
