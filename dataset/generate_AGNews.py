"""Partition AG News (Zhang et al. 2015; 127,600 news articles, 4 topics) among federated clients.

Label skew, text. Source: the official CSVs of the character-level CNN paper
(ag_news_csv.tgz, downloaded when online), or ``--source`` the archive or its folder
(``train.csv``, ``test.csv``: "class index from 1","title","body"; ``classes.txt``). Train and
test are merged and re-split per client. Text is tokenised by the library's own tokenizer
(lower case; words, numbers, punctuation marks), the vocabulary is the --vocab-size most
frequent train.csv tokens with <pad> = 0 and <unk> = 1, saved as ``vocab.txt``, and each
sample is --max-len token ids padded with 0 (PFLlib: torchtext's basic_english, 32,000
tokens, 200 ids). Writes::

    AGNews/train/<i>.npz, AGNews/test/<i>.npz   x int64 [n, 200] token ids, y int64 [n]
    AGNews/vocab.txt                               line i = token of id i
    AGNews/config.json                             modality text, vocab_size, max_len

Example::

    python dataset/generate_AGNews.py noniid - dir
    python system/main.py -data AGNews -m fastText -vs 32000
"""

import sys

if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

from dataset.utils import readers as rd  # noqa: E402
from dataset.utils.dataset_utils import run_cli  # noqa: E402
from dataset.utils.zoo import ZooSpec, csv_text_loader, generate  # noqa: E402

URL = "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz"
SPEC = ZooSpec(name="AGNews", scenario="label skew", modality="text", num_classes=4, input_shape=(200,),
               default_model="fastText", clients="20 (partitioned)", raw_name="ag_news_csv.tgz", where=URL, url=URL)


load = csv_text_loader(SPEC.raw_name)  # train.csv / test.csv, vocabulary from train.csv


def main(argv=None):
    """Parse argv (default: the command line) and write the split; returns 0 on success."""
    return generate(SPEC, argv, load, rd.add_text_flags)


if __name__ == "__main__":
    sys.exit(run_cli(main))
