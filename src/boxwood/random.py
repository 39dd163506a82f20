"""Random keys and draws for building models, without a compile per shape.

Outside `jit`, each `jax.random.split(key, n)` compiles an XLA kernel for that `n`
(and unpacking its result compiles slicing kernels), and each
`jax.random.uniform(key, shape)` one for that shape: on a 2-core machine, tenths of a
second each, paid again in every fresh process. The functions here give the same
values, bit for bit, while compiling nothing per shape: keys are split on the host
(Threefry-2x32 in NumPy) and draws go through one shared kernel per (distribution,
dtype). boxwood's layers use them for their default initialisation; use them in
your own constructors in the same way:

```python
import boxwood as bw

class Block(bw.Module):
    def __init__(self, key):
        k1, k2 = bw.random.split_keys(key)  # was: jax.random.split(key)
        ...
```

Each falls back to the direct `jax.random` call where the fast path does not apply:
a traced key (inside `jit`/`vmap`, where there is nothing to save), a PRNG
implementation other than threefry, `jax_threefry_partitionable=False`, a batch of
keys, or a key on a non-default device.
"""

from ._init import normal as normal
from ._init import split_keys as split_keys
from ._init import truncated_normal as truncated_normal
from ._init import uniform as uniform

__all__ = ["split_keys", "uniform", "normal", "truncated_normal"]
