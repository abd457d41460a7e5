"""Gradient inversion: DLG and iDLG, and the image metrics that score them.

DLG -- Zhu, Liu, Han. "Deep Leakage from Gradients". NeurIPS 2019. https://arxiv.org/abs/1906.08935
    Optimise dummy inputs x' and dummy soft labels y' with L-BFGS so that the gradient they produce on the
    attacked model matches the observed one:  min_{x',y'} sum_l || dL(F(x'), softmax(y'))/dW_l - g_l ||^2.
iDLG -- Zhao, Mopuri, Bilen. "iDLG: Improved Deep Leakage from Gradients". 2020. https://arxiv.org/abs/2001.02610
    With cross-entropy and non-negative features feeding the classifier (ReLU before ``fc``), the gradient of
    the classifier's weight row c is (p_c - y_c) h: only the true class has a negative row. The label is read
    off that sign, then only x' is optimised against the hard label.
Inverting Gradients (IG) -- Geiping, Bauermeister, Dröge, Moeller. "Inverting Gradients -- How easy is it to
    break privacy in federated learning?". NeurIPS 2020. https://arxiv.org/abs/2003.14053
    Matches the gradient's direction, not its magnitude, with a total-variation prior on the image:
    min_{x'} 1 - <g(x'), g> / (||g(x')|| ||g||) + alpha_TV TV(x'), the cosine taken over all attacked
    parameters at once, TV(x) = mean |x[.., i, j+1] - x[.., i, j]| + mean |x[.., i+1, j] - x[.., i, j]|.
    Adam (lr 0.1) on the signs of the gradient with respect to x', the learning rate divided by 10 at
    3/8, 5/8 and 7/8 of the iterations, x' kept in the valid pixel box after every step; the label is
    inferred as in iDLG (``infer_labels``), as the paper does.

Everything here is a pure function of its arguments: a model (never modified: gradients are taken
with ``torch.func.functional_call`` on detached copies of its parameters), a target gradient as a
``{parameter name: tensor}`` dict (so an upload that holds only some parameters, e.g. a model-splitting
method's body, is attacked on exactly what it holds), an explicit iteration budget, tolerance and
``torch.Generator``. Which gradient to attack and what to do with the scores is ``utils/privacy_monitor.py``'s job.

Metrics take images already de-normalised to [0, 1] (``denormalize``): PSNR and SSIM per image, with the
best one-to-one match between reconstructions and originals (Hungarian assignment on PSNR) because DLG
recovers a batch in no particular order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from utils.entries import trainable_names

MAX_PSNR = 100.0  # dB reported for a perfect reconstruction (MSE 1e-10), so means stay finite


# ---- gradients -------------------------------------------------------------------------------------
def grads_or_zeros(loss: torch.Tensor, tensors: list[torch.Tensor], create_graph: bool = False) -> list:
    """d loss / d each tensor; a tensor the loss does not use (a parameter only an algorithm's own loss
    trains, as GPFL's conditional embedding or PFL-DA's global head) gets zeros: what a client computing
    the plain cross-entropy gradient would release for it."""
    grads = torch.autograd.grad(loss, tensors, create_graph=create_graph, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]


def model_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The true gradient of the mean cross-entropy of ``model`` on the batch (x, y): what a client running
    one step of FedSGD would send. ``names`` (default: every trainable parameter) picks the entries."""
    names = names or trainable_names(model)
    params = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters() if n in names}
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    grads = grads_or_zeros(loss, [params[n] for n in names])
    return {n: g.detach() for n, g in zip(names, grads)}


def pseudo_gradient(start: dict[str, torch.Tensor], uploaded: dict[str, torch.Tensor], lr: float,
                    steps: int, names: list[str]) -> dict[str, torch.Tensor]:
    """What an upload reveals as a gradient: (W_start - W_uploaded) / (lr * steps) for each parameter in
    ``names`` that the upload holds. For one local SGD step this is exactly the batch gradient; for many
    it is the mean gradient along the local trajectory (the attack treats it as one gradient at W_start)."""
    scale = 1.0 / (lr * max(steps, 1))
    return {n: (start[n] - uploaded[n].to(start[n].device)).float() * scale for n in names if n in uploaded}


def classifier_name(model: nn.Module, num_classes: int) -> str | None:
    """Name of the classifier's weight: the last 2-D parameter with ``num_classes`` rows (the library's
    ``fc.weight``, ``head.weight`` after a head split)."""
    found = None
    for n, p in model.named_parameters():
        if p.dim() == 2 and p.shape[0] == num_classes:
            found = n
    return found


def infer_labels(grads: dict[str, torch.Tensor], weight_name: str | None, batch: int) -> torch.Tensor | None:
    """Labels from the classifier-weight gradient ∇W (classes x features). One image: iDLG's rule (Zhao et
    al. 2020), the class whose row sums to the most negative value (with non-negative features only the true
    class's row is negative). ``batch`` > 1: GradInversion's rule (Yin et al., CVPR 2021), the ``batch``
    classes whose rows have the most negative *minimum entry* (argsort over n of min_m ∇W_nm), exact only
    when the batch's labels are distinct. None when the target holds no classifier gradient (the head was
    not uploaded)."""
    if weight_name is None or weight_name not in grads:
        return None
    g = grads[weight_name]
    score = g.sum(dim=1) if batch == 1 else g.min(dim=1).values
    return torch.argsort(score)[:batch].sort().values


# ---- the attack ------------------------------------------------------------------------------------
@dataclass
class Reconstruction:
    x: torch.Tensor                # dummy inputs with the lowest matching loss, in the model's input space
    labels: torch.Tensor           # recovered labels (iDLG: inferred; DLG: argmax of the dummy soft labels)
    loss: float                    # lowest gradient-matching loss reached
    iterations: int                # optimizer iterations run (L-BFGS for DLG/iDLG, Adam for IG)
    history: list[float]           # matching loss after each chunk of L-BFGS iterations (IG: every 100th cost)


def cosine_loss(grads, target: list[torch.Tensor]) -> torch.Tensor:
    """IG's matching cost: 1 - cos(g, t), the cosine of the two gradients flattened and concatenated over
    every attacked parameter (one angle, not one per layer)."""
    dot = sum((g * t).sum() for g, t in zip(grads, target))
    gn = torch.sqrt(sum((g * g).sum() for g in grads))
    tn = torch.sqrt(sum((t * t).sum() for t in target))
    return 1 - dot / (gn * tn + 1e-12)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation of N x C x H x W images as IG uses it: the mean absolute difference of
    horizontal neighbours plus that of vertical neighbours."""
    return (x[..., :, 1:] - x[..., :, :-1]).abs().mean() + (x[..., 1:, :] - x[..., :-1, :]).abs().mean()


def _dummy_gradient(model, params, names, x, soft_or_hard):
    out = functional_call(model, params, (x,))
    if soft_or_hard.dtype == torch.long:
        loss = F.cross_entropy(out, soft_or_hard)
    else:
        loss = -(F.softmax(soft_or_hard, dim=-1) * F.log_softmax(out, dim=-1)).sum(dim=-1).mean()
    return grads_or_zeros(loss, [params[n] for n in names], create_graph=True)


def _released_gradient(model, params, names, x, soft_or_hard, clip=None):
    """The dummies' gradient as the client would release it: the batch gradient, or with ``clip`` the mean
    of per-sample gradients clipped to norm ``clip`` (DP-SGD before its noise)."""
    if clip is None:
        return _dummy_gradient(model, params, names, x, soft_or_hard)
    grads = [0.0] * len(names)
    for i in range(len(x)):
        gi = _dummy_gradient(model, params, names, x[i:i + 1], soft_or_hard[i:i + 1])
        scale = (clip / (torch.sqrt(sum((g ** 2).sum() for g in gi)) + 1e-6)).clamp(max=1.0)
        grads = [acc + g * scale / len(x) for acc, g in zip(grads, gi)]
    return grads


def _dummies(model, target, input_shape, batch, num_classes, labels, generator, infer):
    """What both attacks start from: the target's device and parameter names, the model's parameters with
    those made differentiable copies, and the dummies drawn from N(0, 1) with ``generator`` (inputs, then soft
    labels unless ``labels`` are given or, with ``infer``, inferred from the target), with the list of those
    optimised."""
    device = next(iter(target.values())).device
    names = list(target)
    params = {n: p.detach() for n, p in model.named_parameters()}
    for n in names:
        params[n] = params[n].clone().requires_grad_(True)
    if infer and labels is None:
        labels = infer_labels(target, classifier_name(model, num_classes), batch)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    x = torch.randn((batch, *input_shape), generator=generator, device=gen_device).to(device).requires_grad_(True)
    if labels is not None:
        return device, names, params, x, labels.to(device), [x]
    y = torch.randn((batch, num_classes), generator=generator, device=gen_device).to(device).requires_grad_(True)
    return device, names, params, x, y, [x, y]


def invert_gradients(model: nn.Module, target: dict[str, torch.Tensor], input_shape: tuple[int, ...], batch: int,
                     num_classes: int, *, labels: torch.Tensor | None = None, iters: int = 4000, tv: float = 1e-4,
                     lr: float = 0.1, generator: torch.Generator | None = None, bounds=None,
                     clip: float | None = None) -> Reconstruction:
    """Inverting Gradients (Geiping et al. 2020, see the module docstring): recover ``batch`` inputs whose
    gradient on ``model`` points the way ``target`` does. ``labels`` default to ``infer_labels`` on the
    target (DLG's soft labels are optimised jointly when the target holds no classifier gradient).
    ``bounds`` (low, high), broadcastable to the inputs (the normalised images of pixels 0 and 1), is the
    box the dummies are projected into after each step; None: no box. ``clip`` makes the attacker
    DP-aware as in ``reconstruct``. The dummy with the lowest cost seen is returned. The total-variation
    prior is defined on images (``input_shape`` C x H x W); other inputs need ``tv=0``."""
    if tv and len(input_shape) != 3:
        raise ValueError(f"invert_gradients: the total-variation prior needs image inputs (C x H x W), got inputs "
                         f"of shape {tuple(input_shape)}; pass tv=0")
    device, names, params, x, y, variables = _dummies(model, target, input_shape, batch, num_classes, labels,
                                                      generator, infer=True)
    opt = torch.optim.Adam(variables, lr=lr)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[int(iters * f) for f in (3 / 8, 5 / 8, 7 / 8)],
                                                 gamma=0.1)
    tgt = [target[n] for n in names]
    lo, hi = (None, None) if bounds is None else (torch.as_tensor(bounds[0], device=device),
                                                  torch.as_tensor(bounds[1], device=device))
    best = (float("inf"), x.detach().clone(), y.detach().clone())
    history: list[float] = []
    done = 0
    for it in range(iters):
        opt.zero_grad(set_to_none=True)
        grads = _released_gradient(model, params, names, x, y, clip)
        loss = cosine_loss(grads, tgt)
        if tv:
            loss = loss + tv * total_variation(x)
        value = float(loss.detach())
        if value < best[0]:  # the cost of the current dummy, before this step moves it
            best = (value, x.detach().clone(), y.detach().clone())
        if not value == value:
            break
        loss.backward()
        for v in variables:
            v.grad.sign_()
        opt.step()
        sched.step()
        if lo is not None:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, hi), lo))
        if it % 100 == 0:
            history.append(value)
        done = it + 1
    _, bx, by = best
    out_labels = by if by.dtype == torch.long else by.argmax(dim=-1)
    return Reconstruction(bx, out_labels, best[0], done, history)


def _matching_loss(model, params, names, target, x, soft_or_hard, clip=None):
    grads = _released_gradient(model, params, names, x, soft_or_hard, clip)
    return sum(((g - target[n]) ** 2).sum() for n, g in zip(names, grads))


def reconstruct(model: nn.Module, target: dict[str, torch.Tensor], input_shape: tuple[int, ...], batch: int,
                num_classes: int, *, method: str = "dlg", labels: torch.Tensor | None = None,
                iters: int = 300, tol: float = 1e-8, generator: torch.Generator | None = None,
                chunk: int = 20, stall: int = 5, line_search: str | None = None,
                clip: float | None = None) -> Reconstruction:
    """Recover ``batch`` inputs whose gradient on ``model`` matches ``target``.

    ``method`` "dlg" optimises inputs and soft labels jointly; "idlg" fixes the labels (``labels`` if
    given, else ``infer_labels`` on the target; when the target has no classifier gradient it falls back
    to DLG's joint optimisation) and optimises inputs only. Dummies start from N(0, 1) drawn from
    ``generator``. L-BFGS as in the DLG code (lr 1, history 100, no line search: on ReLU/max-pool
    networks a strong-Wolfe search, ``line_search="strong_wolfe"``, tends to stop at the first kink) runs
    at most ``iters`` iterations, ``chunk`` at a time, and stops early when the matching loss drops below
    ``tol`` or stalls (the best loss less than 0.1 % lower than ``stall`` chunks ago). Steps without a
    line search are not monotone, so the dummy with the lowest loss seen is returned (a diverging step,
    e.g. to NaN, is never kept).

    ``clip`` makes the attack DP-aware: the dummy gradient is then what DP-SGD would release for the
    dummies before adding noise (per-sample gradients clipped to norm ``clip``, averaged). The clip norm
    is part of the public protocol; without it, a clipped gradient is mismatched in scale only, and an
    attack defeated by clipping alone would credit DP's noise with what is really an attacker's mistake."""
    if method not in ("dlg", "idlg"):
        raise ValueError(f"unknown attack '{method}'; use 'dlg' or 'idlg'")
    idlg = method == "idlg"
    _, names, params, x, y, variables = _dummies(model, target, input_shape, batch, num_classes,
                                                 labels if idlg else None, generator, infer=idlg)
    opt = torch.optim.LBFGS(variables, lr=1.0, max_iter=chunk, history_size=100, line_search_fn=line_search,
                            tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = _matching_loss(model, params, names, target, x, y, clip)
        loss.backward()
        return loss

    best = (float("inf"), x.detach().clone(), y.detach().clone())
    history: list[float] = []
    best_seen: list[float] = []
    done = 0
    while done < iters:
        opt.param_groups[0]["max_iter"] = min(chunk, iters - done)
        opt.step(closure)
        state = opt.state[x]
        ran = int(state.get("n_iter", 0)) - done
        done += max(ran, 0)
        finite = bool(torch.isfinite(x).all() and torch.isfinite(y.float()).all())
        loss = float(_matching_loss(model, params, names, target, x, y, clip).detach()) if finite else float("nan")
        history.append(loss)
        if loss < best[0]:
            best = (loss, x.detach().clone(), y.detach().clone())
        best_seen.append(best[0])
        stalled = len(best_seen) > stall and best_seen[-1 - stall] - best[0] < 1e-3 * best_seen[-1 - stall]
        if not loss == loss or best[0] < tol or ran <= 0 or stalled:  # NaN, converged, or no progress
            break
    _, bx, by = best
    out_labels = by if by.dtype == torch.long else by.argmax(dim=-1)
    return Reconstruction(bx, out_labels, best[0], done, history)


# ---- metrics ---------------------------------------------------------------------------------------
def denormalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """Inputs normalised as (p - mean) / std back to pixels in [0, 1] (clamped), per channel."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(shape)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(shape)
    return (x * s + m).clamp(0.0, 1.0)


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Per-image PSNR in dB, 10 log10(range^2 / MSE), MSE over all channels and pixels of each image
    (N x C x H x W -> N). A perfect match is reported as ``MAX_PSNR``."""
    mse = ((a.double() - b.double()) ** 2).flatten(1).mean(dim=1).clamp_min(1e-10)
    return (10 * torch.log10(data_range ** 2 / mse)).clamp(max=MAX_PSNR).float()


def _gaussian_window(size: int, sigma: float, dtype, device) -> torch.Tensor:
    r = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2
    g = torch.exp(-r ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Per-image SSIM (Wang, Bovik, Sheikh, Simoncelli, IEEE TIP 2004): local statistics under an 11x11
    Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03, no padding (valid windows only), averaged over the
    map and the channels (N x C x H x W -> N). Images smaller than 11 pixels use the largest odd window
    that fits (7 for 8x8 digits) with the same sigma."""
    a, b = a.double(), b.double()
    n, c, h, w = a.shape
    size = min(11, min(h, w) if min(h, w) % 2 else min(h, w) - 1)
    win = _gaussian_window(size, 1.5, a.dtype, a.device).expand(c, 1, size, size)

    def filt(t):
        return F.conv2d(t, win, groups=c)

    mu_a, mu_b = filt(a), filt(b)
    var_a = filt(a * a) - mu_a ** 2
    var_b = filt(b * b) - mu_b ** 2
    cov = filt(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    smap = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return smap.flatten(1).mean(dim=1).float()


def match(originals: torch.Tensor, recon: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Best one-to-one pairing of reconstructions with originals (the batch order is unknown to the
    attacker): Hungarian assignment maximising the summed PSNR. Returns (original index, PSNR) for each
    reconstruction in order; ``originals`` may hold more images than ``recon`` (e.g. a client's whole
    training set when an upload is attacked)."""
    from scipy.optimize import linear_sum_assignment

    r = recon.flatten(1).double()
    o = originals.flatten(1).double()
    mse = ((r ** 2).sum(1, keepdim=True) - 2 * r @ o.T + (o ** 2).sum(1)[None]).clamp_min(1e-10) / r.shape[1]
    score = (10 * torch.log10(1.0 / mse)).clamp(max=MAX_PSNR)
    rows, cols = linear_sum_assignment(score.cpu().numpy(), maximize=True)
    order = torch.as_tensor(cols[rows.argsort()], dtype=torch.long)
    return order, score[torch.arange(len(r)), order].float()


def save_grid(originals: torch.Tensor, recon: torch.Tensor, path, titles: list[str] | None = None,
              max_images: int = 8) -> None:
    """Two rows of images in [0, 1]: originals on top, their reconstructions below (titled, e.g. with
    PSNR). Written with matplotlib's non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = min(len(recon), max_images)
    fig, axes = plt.subplots(2, k, figsize=(1.4 * k, 3.0), squeeze=False)
    for j in range(k):
        for row, img in ((0, originals[j]), (1, recon[j])):
            ax = axes[row][j]
            # H x W x C; matplotlib draws a single channel (H x W x 1) as a grey-scale H x W image
            ax.imshow(img.detach().cpu().permute(1, 2, 0).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        if titles:
            axes[1][j].set_title(titles[j], fontsize=7)
    axes[0][0].set_ylabel("original", fontsize=8)
    axes[1][0].set_ylabel("recon.", fontsize=8)
    fig.tight_layout()
    from pathlib import Path

    from utils import fileio

    path = Path(path)
    try:  # through the I/O layer: a temporary file renamed into place, no symlink followed
        fileio.Folder(path.parent).replace([(path.name, lambda f: fig.savefig(f, dpi=80, format="png"))])
    finally:
        plt.close(fig)
