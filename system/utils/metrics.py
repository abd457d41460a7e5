"""Evaluation metrics on one client's predictions, and their summary across clients."""
from __future__ import annotations

import numpy as np
import torch

from utils.batching import session


def auc_ovr(probs: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Micro-averaged one-vs-rest ROC AUC on softmax probabilities (PFLlib's definition, but on
    probabilities rather than raw logits): every (sample, class) pair is one binary decision, positive for
    the sample's own class. With two or more classes it is defined for any client with a test sample, even
    one whose labels are all one class (the other classes' columns are its negatives); NaN for an empty
    test split (or a single class).

    Computed as the Mann-Whitney statistic (the area under the ROC curve, ties counted half): the mean rank
    of the positive scores among all scores. That is exactly scikit-learn's ``roc_auc_score`` on the
    flattened decisions (tests/test_models.py compares them) at a small fraction of its per-call cost,
    which at 20 clients evaluated every round was 12 % of a FedAvg round (docs/performance.md)."""
    if len(labels) == 0 or num_classes < 2:
        return float("nan")
    scores = np.asarray(probs, dtype=np.float64).ravel()
    positive = np.zeros(scores.shape, dtype=bool)
    positive[np.arange(len(labels)) * num_classes + np.asarray(labels)] = True
    n_pos = len(labels)
    n_neg = scores.size - n_pos
    return float((average_ranks(scores)[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return ranks


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of ``model`` on ``x`` in large no-grad batches (eval mode; the caller restores train mode).

    Images on a CPU go through the convolutions channels-last (temporary channels-last copies of the
    4-d weights, the model itself untouched): oneDNN's channels-last convolution and pooling kernels
    are several times faster there than the default layout's (docs/performance.md). Same function, so
    the same logits up to float summation order."""
    model.eval()
    batched = session()  # --executor batched: evaluated together with the other clients' models
    if batched is not None:
        return batched.predict(model, x, batch_size)
    starts = range(0, max(len(x), 1), batch_size)  # an empty input still gives its (0, classes) logits
    if x.dim() == 4 and x.device.type == "cpu" and any(p.dim() == 4 for p in model.parameters()):
        cl = torch.channels_last
        params = {n: p.to(memory_format=cl) if p.dim() == 4 else p for n, p in model.named_parameters()}
        return torch.cat([torch.func.functional_call(model, params, (x[i:i + batch_size].to(memory_format=cl),))
                          for i in starts])
    return torch.cat([model(x[i:i + batch_size]) for i in starts])


def summarize(correct: np.ndarray, n_test: np.ndarray, auc: np.ndarray, loss_sum: np.ndarray,
              n_train: np.ndarray) -> dict:
    """Round summary over clients: pooled (sample-weighted) accuracy, unweighted mean/std across clients,
    the worst client's accuracy and the 10th percentile of the clients' accuracies (numpy's linear
    interpolation between order statistics), sample-weighted AUC (clients with undefined AUC left out) and
    sample-weighted train loss. A client with an empty test split has accuracy NaN and is left out of
    the mean, std, worst and percentile."""
    acc = np.where(n_test > 0, correct / np.maximum(n_test, 1), np.nan)
    ok = ~np.isnan(auc)
    tested = ~np.isnan(acc)
    spread = acc[tested]
    nan = float("nan")
    return {
        "test_acc": float(correct.sum() / n_test.sum()) if n_test.sum() else nan,  # no client tested: no figure
        "test_acc_mean": float(spread.mean()) if tested.any() else nan,
        "test_acc_std": float(spread.std()) if tested.any() else nan,
        "test_acc_min": float(spread.min()) if tested.any() else nan,
        "test_acc_p10": float(np.percentile(spread, 10)) if tested.any() else nan,
        "test_auc": float((auc[ok] * n_test[ok]).sum() / max(n_test[ok].sum(), 1)) if ok.any() else float("nan"),
        "train_loss": float(loss_sum.sum() / max(n_train.sum(), 1)) if n_train.sum() else float("nan"),
        "client_test_acc": acc,
    }
