"""`GetKey`: fresh PRNG keys for tests."""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

import jax


def _default_seed() -> int | None:
    value = os.environ.get("BOXWOOD_GETKEY_SEED") or os.environ.get("EQX_GETKEY_SEED")
    return None if value is None else int(value)


@dataclasses.dataclass(eq=False)
class GetKey:
    """A test fixture's key source: each call returns a new key.

    Without a `seed` a random one is drawn (printed in the repr, so a failing test
    can be rerun with it); the environment variable `BOXWOOD_GETKEY_SEED` (or
    Equinox's `EQX_GETKEY_SEED`) fixes it. Meant for tests only.

    >>> import jax
    >>> from boxwood.internal import GetKey
    >>> getkey = GetKey(seed=0)
    >>> k1, k2 = getkey(), getkey()
    >>> bool((jax.random.key_data(k1) == jax.random.key_data(k2)).all())
    False
    """

    seed: int
    call: int
    key: Any

    def __init__(self, seed: int | None = None):
        if seed is None:
            seed = _default_seed()
        if seed is None:
            seed = random.randint(0, 2**31 - 1)
        self.seed = seed
        self.call = 0
        self.key = jax.random.key(seed)

    def __call__(self) -> Any:
        self.call += 1
        return jax.random.fold_in(self.key, self.call)
