"""Federated Shakespeare as LEAF builds it (Caldas et al. 2018; next-character prediction, one client per role).

Real world: each speaking role is a client (``--num-clients N`` keeps the N largest);
``--partition`` re-partitions by label instead. A sample is 80 characters and its label
the next character, among LEAF's 80 characters (80 classes). Inputs are token ids
1 + the character's LEAF index, so that 0 stays the padding id of every text split
(vocab_size 81; PFLlib feeds the raw LEAF indices with vocab 80); an input character
outside LEAF's alphabet becomes 0, a sample whose target is outside it is dropped. Source
(LEAF's preprocessing, e.g. ``./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`` in
leaf/data/shakespeare): ``--source`` a LEAF json or a folder of them:
{"users": [...], "user_data": {user: {"x": [80-character strings], "y": [characters]}}}.
Writes::

    Shakespeare/train/<i>.npz, Shakespeare/test/<i>.npz   x int64 [n, 80], y int64 [n]
    Shakespeare/vocab.txt                                line i = token of id i (newline written as \\n)
    Shakespeare/config.json                              client_groups: the role of each client

Example::

    python dataset/generate_Shakespeare.py --source leaf/data/shakespeare/data
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

import numpy as np  # noqa: E402

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import run_cli  # noqa: E402
from dataset.utils.zoo import Loaded, ZooSpec, generate  # noqa: E402

# LEAF's alphabet (leaf/models/utils/language_utils.py): the class of a character is its position here.
LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80
SPEC = ZooSpec(name="Shakespeare", scenario="real world", modality="text", num_classes=len(LETTERS),
               input_shape=(SEQ_LEN,), default_model="fastText", clients="speaking roles (1,129 in LEAF)",
               raw_name="shakespeare",
               where="LEAF (https://github.com/TalwalkarLab/leaf: data/shakespeare, ./preprocess.sh -s niid --sf 1.0 "
                     "-k 0 -t sample; pass its data/ folder)")


def load(src, args):
    """Pool every LEAF json's users; encode characters as 1 + LEAF index."""
    users, xs, ys = rd.read_leaf(src)
    index = {c: i for i, c in enumerate(LETTERS)}
    x_rows, labels, groups = [], [], []
    for g, (texts, targets) in enumerate(zip(xs, ys)):
        for text, target in zip(texts, targets):
            if target in index and len(text) == SEQ_LEN:
                x_rows.append([index.get(c, -1) + 1 for c in text])
                labels.append(index[target])
                groups.append(g)
    vocab = [rd.PAD] + [c.replace("\n", "\\n") for c in LETTERS]
    return Loaded(x=np.array(x_rows, dtype=np.int64).reshape(-1, SEQ_LEN), y=np.array(labels, dtype=np.int64),
                  groups=np.array(groups, dtype=np.int64), group_names=users,
                  extra={"vocab_size": len(vocab), "max_len": SEQ_LEN, "vocab_file": "vocab.txt"},
                  files={"vocab.txt": rd.vocab_text(vocab)})


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load)


if __name__ == "__main__":
    sys.exit(run_cli(main))
