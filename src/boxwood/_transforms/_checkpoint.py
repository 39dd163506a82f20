"""`filter_checkpoint`: rematerialisation for functions of arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from .._filters import combine, is_array, partition
from .._module import as_pytree_function, field
from ._split import OutBox, split_out
from ._wrapped import Wrapped


class _Checkpointed(Wrapped):
    prevent_cse: bool = field(static=True)
    policy: Callable | None = field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamic, static = partition((self.fun, args, kwargs), is_array)
        box = OutBox()

        def run(dyn: Any) -> Any:
            f, a, kw = combine(dyn, static)
            return split_out(f(*a, **kw), box)

        remat = jax.checkpoint(run, prevent_cse=self.prevent_cse, policy=self.policy)
        out_dynamic = remat(dynamic)
        return combine(out_dynamic, box.get())


def filter_checkpoint(
    fun: Callable | None = None,
    *,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Callable:
    """`jax.checkpoint` (gradient checkpointing) for functions of arbitrary pytrees.

    Under reverse-mode differentiation, the intermediate values of `fun` are not
    stored for the backward pass but recomputed, trading compute for memory. The
    arrays of the arguments (and of `fun`, when it is a module or a bound method of
    one) are traced; every other leaf is static. Usable as `@filter_checkpoint` or
    `@filter_checkpoint(policy=...)`.

    **Arguments:**

    - `fun`: the function, called as `fun(*args, **kwargs)`; it may return any
      pytree (its non-array leaves are returned as they are).
    - `prevent_cse`: as in `jax.checkpoint`: stop XLA from merging the recomputation
      with the original computation.
    - `policy`: as in `jax.checkpoint`, one of `jax.checkpoint_policies`, choosing
      which intermediates may be saved rather than recomputed.

    **Returns:**

    The checkpointed function.
    """
    if fun is None:
        return functools.partial(
            filter_checkpoint, prevent_cse=prevent_cse, policy=policy
        )
    return _Checkpointed(as_pytree_function(fun), prevent_cse, policy)
