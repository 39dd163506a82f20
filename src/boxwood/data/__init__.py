"""Small datasets shipped inside the package (no downloads at run time)."""

from __future__ import annotations

import gzip
from importlib import resources

import numpy as np

from ._idx import load_mnist as load_mnist
from ._idx import read_idx as read_idx


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The UCI handwritten digits (1797 8x8 images, pixel values 0..16).

    Provenance and citation: `digits_DESCR.rst` beside this file. The data is by
    E. Alpaydin and C. Kaynak (UCI Machine Learning Repository), licensed CC BY 4.0
    (https://creativecommons.org/licenses/by/4.0/); see also the project's NOTICE.

    **Returns:** `(images, labels)`: `float32[1797, 8, 8]` scaled to `[0, 1]`, and
    `int32[1797]` labels 0..9.

    >>> images, labels = load_digits()
    >>> images.shape, labels.shape, int(labels.max())
    ((1797, 8, 8), (1797,), 9)
    """
    raw = resources.files(__name__).joinpath("digits.csv.gz").read_bytes()
    table = np.loadtxt(
        gzip.decompress(raw).decode().splitlines(), delimiter=",", dtype=np.int64
    )
    images = (table[:, :64] / 16.0).astype(np.float32).reshape(-1, 8, 8)
    return images, table[:, 64].astype(np.int32)


def load_text() -> str:
    """About 185,000 characters of English prose: 676 paragraphs of the Python
    Language Reference, as CPython ships it (`pydoc_data.topics`), in ASCII,
    paragraphs separated by a blank line.

    Provenance and licence (Python Software Foundation License): see
    `python_reference_DESCR.rst` beside this file and the project's NOTICE. A
    small corpus for training a language model from scratch
    (docs/training.md); read as bytes it needs no tokenizer:
    `np.frombuffer(load_text().encode(), np.uint8)` is one token per character,
    from a vocabulary of 256.

    >>> text = load_text()
    >>> len(text) > 180_000, text.isascii(), text[:17]
    (True, True, 'Assert statements')
    """
    raw = resources.files(__name__).joinpath("python_reference.txt.gz").read_bytes()
    return gzip.decompress(raw).decode("ascii")


def load_reviews() -> dict[str, tuple[list[str], np.ndarray]]:
    """A small sentence-classification dataset in GLUE's layout: short made-up
    film reviews, each negative (0) or positive (1), in a labelled `"train"`
    (480 sentences) and `"validation"` (120) split and a `"test"` split (120)
    whose labels are withheld as -1, as GLUE's test splits carry them.

    The sentences are made from templates (`_reviews.py`, deterministic; how in
    `reviews_DESCR.rst`): the label is carried by the sentiment words, so a
    bag of words can learn it. For the fine-tuning example of
    docs/training.md.

    **Returns:** a dict from split name to `(sentences, labels)`: a list of
    lower-case strings (words separated by spaces) and `int32` labels.

    >>> reviews = load_reviews()
    >>> {split: len(sentences) for split, (sentences, _) in reviews.items()}
    {'train': 480, 'validation': 120, 'test': 120}
    >>> reviews["train"][0][0], int(reviews["train"][1][0]), set(reviews["test"][1].tolist())
    ('the script and the pacing were both pleasant', 1, {-1})
    """
    raw = resources.files(__name__).joinpath("reviews.tsv.gz").read_bytes()
    splits: dict[str, tuple[list[str], list[int]]] = {}
    for line in gzip.decompress(raw).decode("ascii").splitlines()[1:]:
        split, label, sentence = line.split("\t")
        sentences, labels = splits.setdefault(split, ([], []))
        sentences.append(sentence)
        labels.append(int(label))
    return {
        split: (sentences, np.asarray(labels, np.int32))
        for split, (sentences, labels) in splits.items()
    }
