"""The dataset generators, by name: list them, or run one.

    python dataset/generate.py --list                  # name, scenario, clients, classes, shape, model, source
    python dataset/generate.py TinyImagenet noniid - dir   # = python dataset/generate_TinyImagenet.py noniid - dir

``GENERATORS`` maps each name (as ``-data`` spells the split folder) to its module;
the table's facts come from the module's ``SPEC`` (imported only when listing or
running, so a generator's optional package is needed only for that generator).
"""

import importlib
import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

GENERATORS = {
    # label skew (partitioned by iid / pat / dir / exdir)
    "MNIST": "dataset.generate_MNIST",
    "FashionMNIST": "dataset.generate_FashionMNIST",
    "EMNIST": "dataset.generate_EMNIST",
    "Cifar10": "dataset.generate_Cifar10",
    "Cifar100": "dataset.generate_Cifar100",
    "TinyImagenet": "dataset.generate_TinyImagenet",
    "Country211": "dataset.generate_Country211",
    "Flowers102": "dataset.generate_Flowers102",
    "GTSRB": "dataset.generate_GTSRB",
    "StanfordCars": "dataset.generate_StanfordCars",
    "COVIDx": "dataset.generate_COVIDx",
    "kvasir": "dataset.generate_kvasir",
    "AGNews": "dataset.generate_AGNews",
    "SogouNews": "dataset.generate_SogouNews",
    "Digits": "dataset.generate_Digits",
    # real world (natural clients; --partition re-partitions by label) and Synthetic (generated clients)
    "FEMNIST": "dataset.generate_FEMNIST",
    "Shakespeare": "dataset.generate_Shakespeare",
    "Omniglot": "dataset.generate_Omniglot",
    "HAR": "dataset.generate_HAR",
    "PAMAP2": "dataset.generate_PAMAP2",
    "Camelyon17": "dataset.generate_Camelyon17",
    "iWildCam": "dataset.generate_iWildCam",
    "Synthetic": "dataset.generate_Synthetic",
    # feature shift (one domain per client or group of clients)
    "Digit5": "dataset.generate_Digit5",
    "DomainNet": "dataset.generate_DomainNet",
    "AmazonReview": "dataset.generate_AmazonReview",
}

# The generators that predate the zoo describe themselves here (they have an ImageSpec or none).
_CLASSIC = {
    "MNIST": ("label skew", "20 (partitioned)", 10, "1x28x28", "CNN", "torchvision / --source npz"),
    "FashionMNIST": ("label skew", "20 (partitioned)", 10, "1x28x28", "CNN", "torchvision / --source npz"),
    "Cifar10": ("label skew", "20 (partitioned)", 10, "3x32x32", "CNN", "torchvision / --source npz"),
    "Cifar100": ("label skew", "20 (partitioned)", 100, "3x32x32", "CNN", "torchvision / --source npz"),
    "Digits": ("label skew", "20 (partitioned)", 10, "1x8x8", "CNN", "scikit-learn (bundled, offline)"),
    "Synthetic": ("generated", "20 (own model each)", 10, "60", "DNN", "generated (FedProx), offline"),
}


def describe(name):
    """(scenario, clients, classes, input shape, default model, source) of one generator."""
    if name in _CLASSIC:
        return _CLASSIC[name]
    module = importlib.import_module(GENERATORS[name])
    spec = module.SPEC
    shape = "x".join(str(s) for s in spec.input_shape)
    if spec.fetch:
        source = f"{spec.fetch} download / --source {spec.raw_name}"
    elif spec.url:
        source = f"{spec.raw_name} (downloaded) / --source"
    else:
        source = f"manual: {spec.raw_name} / --source"
    # a generator whose default writes fewer classes than it can (EMNIST's digits split) says so
    classes = getattr(module, "DEFAULT_CLASSES", spec.num_classes)
    return spec.scenario, spec.clients, classes, shape, spec.default_model, source


def table():
    """The --list table, one generator a line."""
    head = ("name", "scenario", "clients", "classes", "input", "model", "source")
    rows = [(n, *map(str, describe(n))) for n in GENERATORS]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows])


def main(argv=None):
    """``--list`` prints the table; ``NAME ARGS...`` runs that generator with ARGS."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[1])
        print(f"generators: {', '.join(GENERATORS)}")
        return 0
    if argv[0] == "--list":
        print(table())
        return 0
    if argv[0] not in GENERATORS:
        print(f"error: unknown dataset {argv[0]!r}; choose one of: {', '.join(GENERATORS)}", file=sys.stderr)
        return 2
    from dataset.utils.dataset_utils import run_cli

    return run_cli(importlib.import_module(GENERATORS[argv[0]]).main, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
