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
