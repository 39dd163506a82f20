"""`dropout_generator` and `set_dropout_generator`: which random bit generator
draws dropout's masks (the setting, the mask and the models' key stream are in
`_init/_dropout_bits.py`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._init import generator_in_thread, set_default_generator


def set_dropout_generator(name: str) -> str:
    """Set the random bit generator of dropout's masks for the whole process
    (see [`boxwood.nn.dropout_generator`][]); returns the previous setting.

    **Arguments:**

    - `name`: `"auto"` (the default), `"threefry"` or `"rbg"`.
    """
    return set_default_generator(name)


@contextlib.contextmanager
def dropout_generator(name: str) -> Iterator[None]:
    """Within the block, dropout's masks ([`boxwood.nn.Dropout`][] and every
    model's dropout) are drawn by the generator `name`:

    - `"auto"` (the default): `"rbg"` when JAX's default backend is a TPU,
      `"threefry"` elsewhere.
    - `"threefry"`: the mask is `jax.random.bernoulli(key, 1 - p, shape)` with
      the key as given: JAX's counter-based threefry, the same bits on every
      backend.
    - `"rbg"`: four words drawn from the key (by the key's own generator: one
      small threefry hash for a threefry key) seed XLA's `RngBitGenerator`,
      whose bits make the mask. On a TPU that is the chip's own generator, a
      few operations per word; threefry there costs some twenty vector
      operations per word and a larger program to compile. The models of
      `boxwood.models` turn their key into an `unsafe_rbg` key once per call
      and derive their layers' keys from it with `RngBitGenerator` as well.

    ```python
    with boxwood.nn.dropout_generator("rbg"):
        loss = step(model, batch, key)  # traced here: masks from RngBitGenerator
    ```

    The setting is read when a dropout layer is traced, in this thread: a
    function already compiled keeps the masks it was traced with. The keys
    users pass are the same for both. [`boxwood.nn.set_dropout_generator`][]
    sets it for the whole process. docs/layers.md gives the statistical
    properties of each.

    **Arguments:**

    - `name`: `"auto"`, `"threefry"` or `"rbg"`.
    """
    with generator_in_thread(name):
        yield
