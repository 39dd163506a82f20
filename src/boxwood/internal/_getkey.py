"""`GetKey`: fresh PRNG keys for tests."""

from __future__ import annotations

import os
import random
from typing import Any

import jax

_SEED_VARIABLES = ("BOXWOOD_GETKEY_SEED", "EQX_GETKEY_SEED")


def _choose_seed(seed: int | None) -> int:
    """`seed` if given, else the first seed variable set, else a random seed."""
    if seed is not None:
        return seed
    for name in _SEED_VARIABLES:
        if os.environ.get(name):
            return int(os.environ[name])
    return random.randint(0, 2**31 - 1)


class GetKey:
    """A test fixture's key source: each call returns a new key.

    Without a `seed` a random one is drawn (printed in the repr, so a failing test
    can be rerun with it); the environment variable `BOXWOOD_GETKEY_SEED` (or
    Equinox's `EQX_GETKEY_SEED`) fixes it. Meant for tests only.

    `seed` is the seed in use and `call` the number of keys handed out; the `n`-th
    key is `jax.random.fold_in(jax.random.key(seed), n)`.

    >>> import jax
    >>> from boxwood.internal import GetKey
    >>> getkey = GetKey(seed=0)
    >>> k1, k2 = getkey(), getkey()
    >>> bool((jax.random.key_data(k1) == jax.random.key_data(k2)).all())
    False
    """

    def __init__(self, seed: int | None = None):
        self.seed = _choose_seed(seed)
        self.call = 0
        self._root = jax.random.key(self.seed)

    def __call__(self) -> Any:
        self.call += 1
        return jax.random.fold_in(self._root, self.call)

    def __repr__(self) -> str:
        return f"GetKey(seed={self.seed}, call={self.call})"
