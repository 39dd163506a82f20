"""`Embedding`."""

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._init import Initializer, check_initializer, init_param, normal
from .._module import Module, field
from ._defaults import resolve_dtype
from ._input_checks import layer_name

_MSG_ARGS = (
    "Embedding: pass either `Embedding(num_embeddings, embedding_size, key=key)` or "
    "`Embedding(weight=table)` with a table of shape (num_embeddings, embedding_size)."
)


def _check_size(value: Any, arg: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"Embedding: `{arg}` must be a non-negative int, got {value!r}."
        )


class Embedding(Module):
    """A lookup table: maps an integer index to a row of `weight`.

    Same signature as `equinox.nn.Embedding`; the default initialisation matches
    `torch.nn.Embedding` (each entry drawn from `N(0, 1)`).

    A negative index counts from the end (as in Equinox and NumPy). An index outside
    `[-num_embeddings, num_embeddings)` raises `IndexError` when the index is a
    concrete value. Under `jax.jit`/`jax.vmap` it cannot be checked and follows
    JAX's indexing rules instead: too-large ones are clamped to the last row.

    >>> import boxwood.nn, jax
    >>> table = boxwood.nn.Embedding(10, 4, key=jax.random.key(0))
    >>> table(3).shape
    (4,)
    """

    weight: Float[Array, "num_embeddings embedding_size"]
    num_embeddings: int = field(static=True)
    embedding_size: int = field(static=True)

    def __init__(
        self,
        num_embeddings: int | None = None,
        embedding_size: int | None = None,
        weight: Float[Array, "num_embeddings embedding_size"] | None = None,
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        key: PRNGKeyArray | None = None,
    ):
        """**Arguments:** either

        - `num_embeddings`: the number of rows of the table.
        - `embedding_size`: the size of each row.
        - `dtype`: dtype of the table. Defaults to `float32`.
        - `weight_init`: optional `(key, shape, dtype) -> array` function (any
          `jax.nn.initializers` function) for the table. Default: `N(0, 1)`, as
          PyTorch. (Keyword only.)
        - `key`: a `jax.random` key for the initialisation. (Keyword only.)

        or

        - `weight`: the table itself, of shape `(num_embeddings, embedding_size)`.
        """
        check_initializer(weight_init, "weight_init", "Embedding")
        if weight is None:
            if num_embeddings is None or embedding_size is None or key is None:
                raise ValueError(_MSG_ARGS)
            _check_size(num_embeddings, "num_embeddings")
            _check_size(embedding_size, "embedding_size")
            dtype = resolve_dtype(dtype, "Embedding")
            shape = (num_embeddings, embedding_size)
            weight = init_param(
                weight_init,
                lambda: normal(key, shape, dtype),
                *(key, shape, dtype, "weight_init", "Embedding"),
            )
        else:
            weight = (
                jnp.asarray(weight) if dtype is None else jnp.asarray(weight, dtype)
            )
            if weight.ndim != 2:
                raise ValueError(f"{_MSG_ARGS} Got a table of shape {weight.shape}.")
            expected = (
                weight.shape[0] if num_embeddings is None else num_embeddings,
                weight.shape[1] if embedding_size is None else embedding_size,
            )
            if weight.shape != expected:
                raise ValueError(
                    f"Embedding: `weight` has shape {weight.shape}, but "
                    f"`num_embeddings` and `embedding_size` say {expected}."
                )
            num_embeddings, embedding_size = expected
        assert weight is not None  # built above when not given
        self.weight = weight
        self.num_embeddings = int(num_embeddings)
        self.embedding_size = int(embedding_size)

    def _check(self, x: Any) -> None:
        name = layer_name(self, "num_embeddings", "embedding_size")
        dtype = jnp.result_type(x)
        if not jnp.issubdtype(dtype, jnp.integer):
            raise TypeError(
                f"{name}: expected an integer index, got dtype {dtype}. Convert it "
                "with `x.astype(jnp.int32)`."
            )
        if jnp.shape(x) != ():
            raise ValueError(
                f"{name}: expected a scalar index of shape (), got {jnp.shape(x)}. "
                "For many indices use `jax.vmap(embedding)(indices)`."
            )
        if not isinstance(x, jax.core.Tracer):
            i = int(x)
            n = self.num_embeddings
            if not -n <= i < n:
                raise IndexError(
                    f"{name}: index {i} is out of range [-{n}, {n}) (a negative "
                    "index counts from the end, as in Equinox)."
                )

    def __call__(
        self, x: Int[ArrayLike, ""], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, " embedding_size"]:
        """**Arguments:**

        - `x`: a scalar integer index. For many indices, `jax.vmap` over them.
        - `key`: ignored. (Keyword only.)

        **Returns:**

        Row `x` of the table, of shape `(embedding_size,)`.
        """
        del key
        self._check(x)
        return self.weight[x]
