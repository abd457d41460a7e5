"""Federated Digit-Five (Peng et al. 2019): MNIST, MNIST-M, SynthDigits, USPS and SVHN, one domain per client.

Feature shift, as PFLlib: the five digit domains (10 shared classes) in PFLlib's order
mnistm, mnist, syn, usps, svhn, each one client (or --clients-per-domain clients), images
as RGB 32x32 (gray domains repeated to three channels, USPS resized from 28x28). Train and
test of each domain are merged and re-split. PFLlib keeps at most 25,000 train and 9,000
test images per domain and repeats USPS four times; here every image is kept once (a
repeated image could land in both a client's train and test part). Source (manual
download, the archive of KD3A/PFLlib): ``--source`` Digit5.zip or its folder holding
``mnist_data.mat`` (train_32/test_32, one-hot label_train/label_test),
``mnistm_with_label.mat`` (train/test [N, 32, 32, 3], one-hot labels),
``svhn_{train,test}_32x32.mat`` and ``synth_{train,test}_32x32.mat`` (X [32, 32, 3, N], y with 10
for digit 0), ``usps_28x28.mat`` (dataset: [[train images [N, 1, 28, 28] in 0..1, labels],
[test images, labels]]). Writes::

    Digit5/train/<i>.npz, Digit5/test/<i>.npz   x uint8 [n, 3, 32, 32], y int64 [n]
    Digit5/config.json                         client_groups: the domain of each client

Example::

    python dataset/generate_Digit5.py --source Digit5.zip
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

DOMAINS = ("mnistm", "mnist", "syn", "usps", "svhn")
SPEC = ZooSpec(name="Digit5", scenario="feature shift", modality="image", num_classes=10, input_shape=(3, 32, 32),
               default_model="CNN", clients="5 domains", raw_name="Digit5.zip",
               where="https://drive.google.com/u/0/uc?id=1PT6K-_wmsUEUCxoYzDy0mxF-15tvb2Eu (Digit5.zip, as PFLlib)",
               image_size=32)


def _domain(folder, name):
    """(images [N, H, W, C] or [N, H, W] uint8-range, labels 0..9) of one domain, train then test."""
    if name in ("mnist", "mnistm"):
        m = rd.read_mat(folder / ("mnist_data.mat" if name == "mnist" else "mnistm_with_label.mat"))
        keys = ("train_32", "test_32") if name == "mnist" else ("train", "test")
        images = [np.asarray(m[k]).reshape(len(m[k]), 32, 32, -1) for k in keys]
        labels = [np.argmax(m[k], axis=1) for k in ("label_train", "label_test")]
    elif name in ("svhn", "syn"):
        stem = "svhn" if name == "svhn" else "synth"
        ms = [rd.read_mat(folder / f"{stem}_{part}_32x32.mat") for part in ("train", "test")]
        images = [m["X"].transpose(3, 0, 1, 2) for m in ms]
        labels = [m["y"].reshape(-1) % 10 for m in ms]
    else:
        data = rd.read_mat(folder / "usps_28x28.mat")["dataset"]
        images = [np.round(np.asarray(data[i][0], dtype=np.float64) * 255).transpose(0, 2, 3, 1) for i in (0, 1)]
        labels = [np.asarray(data[i][1]).reshape(-1) % 10 for i in (0, 1)]
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)


def load(src, args):
    """Every domain's mat files; each image to RGB at --image-size."""
    from PIL import Image

    folder = rd.find_dir(src, "usps_28x28.mat")
    if folder is None:
        raise DatasetError(f"no usps_28x28.mat under {src}; pass Digit5.zip or the folder it unpacks to")
    shape = (3, args.image_size, args.image_size)
    xs, ys, groups = [], [], []
    for g, name in enumerate(DOMAINS):
        try:
            images, labels = _domain(folder, name)
        except (OSError, KeyError, ValueError, IndexError) as err:
            raise DatasetError(f"cannot read the {name} domain of Digit5: {err!r}") from None
        images = np.clip(images, 0, 255).astype(np.uint8)
        xs.append(np.stack([rd.read_image(Image.fromarray(im.squeeze(-1) if im.shape[-1] == 1 else im), shape)
                            for im in images]))
        ys.append(labels)
        groups.append(np.full(len(labels), g))
    return Loaded(x=np.concatenate(xs), y=np.concatenate(ys), groups=np.concatenate(groups),
                  group_names=list(DOMAINS), class_names=[str(d) for d in range(10)])


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
