"""Federated DomainNet (Peng et al. 2019; 345 classes in six domains), one domain per client.

Feature shift, as PFLlib: clipart, infograph, painting, quickdraw, real and sketch, each one
client (or --clients-per-domain clients), images resized to 64x64 (PFLlib also applies a
one-time random crop and flip to the train images; here every image is resized only).
Train and test lists of each domain are merged and re-split. Source (manual download from
the VisDA 2019 page): ``--source`` the folder holding the unpacked domain zips
(``<domain>/<class>/<image>.jpg``) and the split lists ``<domain>_{train,test}.txt`` (in
``splits/`` or beside the domains; lines "<domain>/<class>/<image>.jpg <label>"). Domains
without lists are left out. Writes::

    DomainNet/train/<i>.npz, DomainNet/test/<i>.npz   x uint8 [n, 3, 64, 64], y int64 [n]
    DomainNet/config.json                            client_groups: the domain of each client

Example::

    python dataset/generate_DomainNet.py --source domainnet
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import DatasetError, run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
SPEC = ZooSpec(name="DomainNet", scenario="feature shift", modality="image", num_classes=345,
               input_shape=(3, 64, 64), default_model="CNN", clients="6 domains", raw_name="domainnet",
               where="http://csr.bu.edu/ftp/visda/2019/multi-source/ (the six <domain>.zip and "
                     "domainnet/txt/<domain>_{train,test}.txt; unpack them into one folder)", image_size=64)


def load(src, args):
    """Every domain with split lists; labels from the lists, class names from the class folders."""
    src = rd.find_dir(src, "splits") or src
    lists = {d: [p / f"{d}_{s}.txt" for s in ("train", "test") for p in (src / "splits", src)
                 if (p / f"{d}_{s}.txt").is_file()] for d in DOMAINS}
    present = [d for d in DOMAINS if lists[d]]
    if not present:
        raise DatasetError(f"no <domain>_train.txt split lists under {src} or {src}/splits")
    paths, labels, groups, names = [], [], [], {}
    for g, d in enumerate(present):
        for listing in lists[d]:
            for line in rd.read_text(listing).split("\n"):
                cells = line.split()
                if len(cells) == 2:
                    paths.append(src / cells[0])
                    labels.append(int(cells[1]))
                    groups.append(g)
                    names[int(cells[1])] = Path(cells[0]).parent.name
    shape = (3, args.image_size, args.image_size)
    class_names = [names.get(c, str(c)) for c in range(max(names) + 1)]
    return Loaded(x=rd.read_images(paths, shape), y=np.array(labels, dtype=np.int64),
                  groups=np.array(groups, dtype=np.int64), group_names=present,
                  class_names=class_names if len(class_names) == SPEC.num_classes else None)


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
