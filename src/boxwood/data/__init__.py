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
