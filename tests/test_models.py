"""The CNN's sizes and its BatchNorm variant, and the evaluation metrics (every model of the registry:
tests/test_model_zoo.py)."""
import pytest
import torch

from flcore.trainmodel.models import build_model
from flcore.trainmodel.parts import layer_groups


def test_cnn_flattened_sizes_follow_pfllib():
    assert build_model("CNN", (1, 28, 28), 10).fc1[0].in_features == 1024
    assert build_model("CNN", (3, 32, 32), 10).fc1[0].in_features == 1600


def test_bncnn_is_the_cnn_with_batchnorm_after_each_convolution():
    plain, bn = build_model("CNN", (1, 28, 28), 10), build_model("BNCNN", (1, 28, 28), 10)
    assert [type(m).__name__ for m in bn.conv1] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    assert [type(m).__name__ for m in bn.conv2] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    assert {k for k in bn.state_dict() if "running_mean" in k} == {"conv1.1.running_mean", "conv2.1.running_mean"}
    # the parameters of the plain CNN keep their names (its checkpoints and -p layers are unchanged)
    assert [n for n, _ in plain.named_parameters()] == ["conv1.0.weight", "conv1.0.bias", "conv2.0.weight",
                                                        "conv2.0.bias", "fc1.0.weight", "fc1.0.bias",
                                                        "fc.weight", "fc.bias"]
    # a BatchNorm joins the convolution below it: -p means the same layers on both
    assert [g[0] for g in layer_groups(bn)] == [g[0] for g in layer_groups(plain)]
    assert layer_groups(bn)[0] == ["conv1.0.weight", "conv1.0.bias", "conv1.1.weight", "conv1.1.bias"]


def test_auto_and_bad_choices():
    assert type(build_model("auto", (1, 8, 8), 10)).__name__ == "FedAvgCNN"
    assert type(build_model("auto", (60,), 10)).__name__ == "DNN"
    with pytest.raises(ValueError, match="takes image data"):
        build_model("CNN", (60,), 10)


# ---- evaluation metrics ------------------------------------------------------------------------------------
def test_auc_of_a_single_class_client_is_the_hand_computed_micro_average():
    """Labels [0, 0] over 3 classes: positives are the class-0 column (0.7, 0.4), negatives the other four
    entries (0.2, 0.1, 0.5, 0.1). Of the 8 (positive, negative) pairs the positive ranks higher in
    7 (0.4 < 0.5 is the one miss): AUC = 7 / 8."""
    import numpy as np

    from utils.metrics import auc_ovr

    probs = np.array([[0.7, 0.2, 0.1], [0.4, 0.5, 0.1]])
    assert auc_ovr(probs, np.array([0, 0]), 3) == 7 / 8
    assert np.isnan(auc_ovr(np.zeros((0, 3)), np.zeros(0, dtype=np.int64), 3))  # no test sample


def test_auc_equals_scikit_learns_roc_auc_on_the_flattened_decisions():
    """The rank formula against an independent implementation (scikit-learn's ROC curve and trapezoids),
    on random clients with and without tied scores, one-class clients among them."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from utils.metrics import auc_ovr

    rng = np.random.default_rng(0)
    for trial in range(60):
        n, classes = int(rng.integers(1, 30)), int(rng.integers(2, 11))
        probs = rng.random((n, classes)).astype(np.float32)
        if trial % 2:
            probs = np.round(probs, 1)  # many ties
        probs /= probs.sum(1, keepdims=True)
        labels = rng.integers(0, classes, n) if trial % 5 else np.full(n, trial % classes)
        expected = roc_auc_score(np.eye(classes, dtype=np.int64)[labels].ravel(), probs.ravel())
        assert abs(auc_ovr(probs, labels, classes) - expected) < 1e-12


def test_a_client_without_test_samples_is_evaluated_and_left_out_of_the_mean():
    import numpy as np

    from utils.metrics import predict, summarize

    model = build_model("CNN", (1, 8, 8), 10)
    assert predict(model, torch.zeros(0, 1, 8, 8), 256).shape == (0, 10)
    s = summarize(np.array([3.0, 0.0, 1.0]), np.array([4.0, 0.0, 4.0]), np.array([0.9, np.nan, 0.7]),
                  np.array([2.0, 1.0, 1.0]), np.array([4.0, 2.0, 2.0]))
    assert s["test_acc"] == 4 / 8 and s["test_acc_mean"] == (0.75 + 0.25) / 2 and s["test_acc_std"] == 0.25
    assert s["test_auc"] == (0.9 * 4 + 0.7 * 4) / 8 and np.isnan(s["client_test_acc"][1])
