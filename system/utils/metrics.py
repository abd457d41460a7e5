"""Evaluation metrics on one client's predictions, and their summary across clients."""
from __future__ import annotations

import numpy as np
import torch


def auc_ovr(probs: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Micro-averaged one-vs-rest ROC AUC on softmax probabilities (PFLlib's definition, but on
    probabilities rather than raw logits). NaN when the client's test labels hold a single class only and
    the micro average is undefined."""
    from sklearn.metrics import roc_auc_score

    onehot = np.eye(num_classes, dtype=np.int64)[labels]
    if onehot.min() == onehot.max():
        return float("nan")
    return float(roc_auc_score(onehot.ravel(), probs.ravel()))


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of ``model`` on ``x`` in large no-grad batches (eval mode; the caller restores train mode).

    Images on a CPU go through the convolutions channels-last (temporary channels-last copies of the
    4-d weights, the model itself untouched): oneDNN's channels-last convolution and pooling kernels
    are several times faster there than the default layout's (docs/performance.md). Same function, so
    the same logits up to float summation order."""
    model.eval()
    if x.dim() == 4 and x.device.type == "cpu" and any(p.dim() == 4 for p in model.parameters()):
        cl = torch.channels_last
        params = {n: p.to(memory_format=cl) if p.dim() == 4 else p for n, p in model.named_parameters()}
        return torch.cat([torch.func.functional_call(model, params, (x[i:i + batch_size].to(memory_format=cl),))
                          for i in range(0, len(x), batch_size)])
    return torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def summarize(correct: np.ndarray, n_test: np.ndarray, auc: np.ndarray, loss_sum: np.ndarray,
              n_train: np.ndarray) -> dict:
    """Round summary over clients: pooled (sample-weighted) accuracy, unweighted mean/std across clients,
    sample-weighted AUC (clients with undefined AUC left out) and sample-weighted train loss."""
    acc = correct / np.maximum(n_test, 1)
    ok = ~np.isnan(auc)
    return {
        "test_acc": float(correct.sum() / max(n_test.sum(), 1)),
        "test_acc_mean": float(acc.mean()),
        "test_acc_std": float(acc.std()),
        "test_auc": float((auc[ok] * n_test[ok]).sum() / max(n_test[ok].sum(), 1)) if ok.any() else float("nan"),
        "train_loss": float(loss_sum.sum() / max(n_train.sum(), 1)) if n_train.sum() else float("nan"),
        "client_test_acc": acc,
    }
