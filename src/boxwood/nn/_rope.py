"""`RotaryPositionalEmbedding` (RoPE)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.dtypes import TypePromotionError
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import Module, field
from ._defaults import resolve_dtype
from ._input_checks import check_input, layer_name


def _cos_sin(seq_len: int, size: int, theta: float, dtype: Any) -> tuple[Array, Array]:
    """`cos`/`sin` of the angles `t * theta**(-2j/size)`, shape `(seq_len, size//2)`."""
    angle_dtype = jnp.float64 if dtype == jnp.float64 else jnp.float32
    exponents = jnp.arange(0, size, 2, dtype=angle_dtype) / size
    freqs = 1.0 / (theta**exponents)
    angles = jnp.arange(seq_len, dtype=angle_dtype)[:, None] * freqs[None, :]
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


class RotaryPositionalEmbedding(Module):
    r"""Rotary positional embedding (RoFormer, Su et al. 2021).

    Same signature and rotation convention as `equinox.nn.RotaryPositionalEmbedding`
    (the "rotate half" convention of GPT-NeoX and Hugging Face's Llama): with
    $d$ = `embedding_size` and $j < d/2$, the pair of channels $(j, j + d/2)$ at
    position $t$ is rotated by the angle $t\,\theta^{-2j/d}$:

    $$y_j = x_j \cos(t\omega_j) - x_{j+d/2}\sin(t\omega_j),\qquad
    y_{j+d/2} = x_{j+d/2}\cos(t\omega_j) + x_j\sin(t\omega_j).$$

    Apply it to the query and key heads of a [`boxwood.nn.MultiheadAttention`][]
    through its `process_heads` argument, vmapping over the heads axis:

    ```python
    rope = boxwood.nn.RotaryPositionalEmbedding(qk_size)

    def process_heads(q, k, v):
        q = jax.vmap(rope, in_axes=1, out_axes=1)(q)
        k = jax.vmap(rope, in_axes=1, out_axes=1)(k)
        return q, k, v
    ```
    """

    embedding_size: int = field(static=True)
    theta: float = field(static=True)
    dtype: Any = field(static=True)

    def __init__(self, embedding_size: int, theta: float = 10_000.0, dtype: Any = None):
        """**Arguments:**

        - `embedding_size`: the number of channels; must be even and non-negative.
        - `theta`: the base of the frequencies (10000 in the paper). Larger values
          rotate more slowly.
        - `dtype`: dtype of the cosine and sine tables; defaults to float32 (float64
          in x64 mode). The output always has the input's dtype. Under
          `jax_numpy_dtype_promotion="strict"` the input must have this dtype.
        """
        if embedding_size < 0 or embedding_size % 2 != 0:
            raise ValueError(
                "RotaryPositionalEmbedding: `embedding_size` must be even and "
                f"non-negative, got {embedding_size}."
            )
        self.embedding_size = embedding_size
        self.theta = float(theta)
        self.dtype = resolve_dtype(dtype, "RotaryPositionalEmbedding")

    @staticmethod
    def rotate_half(
        x: Float[Array, "seq_len embedding_size"],
    ) -> Float[Array, "seq_len embedding_size"]:
        """Swap the two halves of the last axis and negate the new first half.

        **Arguments:**

        - `x`: an array whose last axis has even size `d`.

        **Returns:** `concatenate([-x[..., d/2:], x[..., :d/2]])`, so that the layer's
        output is `x * cos + rotate_half(x) * sin` (as in Equinox).

        >>> import boxwood.nn, jax.numpy as jnp
        >>> boxwood.nn.RotaryPositionalEmbedding.rotate_half(jnp.array([1., 2., 3., 4.]))
        Array([-3., -4.,  1.,  2.], dtype=float32)
        """
        front, back = jnp.split(x, [x.shape[-1] // 2], axis=-1)
        return jnp.concatenate([-back, front], axis=-1)

    @staticmethod
    def precompute_freqs_cis(
        embedding_size: int, end: int, theta: float, dtype: Any
    ) -> tuple[Float[Array, "end half_size"], Float[Array, "end half_size"]]:
        """The cosine and sine tables of the rotation angles.

        **Arguments:**

        - `embedding_size`: the (even) number of channels `d`.
        - `end`: the number of positions.
        - `theta`: the base of the frequencies.
        - `dtype`: the dtype of the tables (the angles are computed in at least
          float32 and cast at the end).

        **Returns:** `(cos, sin)`, each of shape `(end, embedding_size // 2)`, of the
        angles `t * theta**(-2j/d)` for position `t` and pair `j`.

        >>> import boxwood.nn, jax.numpy as jnp
        >>> cos, sin = boxwood.nn.RotaryPositionalEmbedding.precompute_freqs_cis(
        ...     4, 3, 10_000.0, jnp.float32)
        >>> cos.shape, sin[1, 0].round(4)
        ((3, 2), Array(0.8415, dtype=float32))
        """
        return _cos_sin(end, embedding_size, theta, dtype)

    def __call__(
        self,
        x: Float[Array, "seq_len embedding_size"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq_len embedding_size"]:
        """**Arguments:**

        - `x`: shape `(seq_len, embedding_size)`; row `t` is position `t`.
        - `key`: ignored.

        **Returns:** the rotated `x`, same shape and dtype.
        """
        name = layer_name(self, "embedding_size")
        check_input(x, ("seq_len", self.embedding_size), name)
        with jax.ensure_compile_time_eval():
            cos, sin = self.precompute_freqs_cis(
                self.embedding_size, x.shape[0], self.theta, self.dtype
            )
        cos, sin = jnp.tile(cos, (1, 2)), jnp.tile(sin, (1, 2))
        try:  # under JAX's current dtype promotion setting, as in Equinox
            out = x * cos + self.rotate_half(x) * sin
        except TypePromotionError as e:
            got, own = jnp.dtype(x.dtype).name, jnp.dtype(self.dtype).name
            raise TypePromotionError(
                f"{name}: the input's dtype {got} differs from the layer's {own}, "
                "and `jax_numpy_dtype_promotion` is 'strict'. Build the layer with "
                f"`dtype=jnp.{got}`, or cast the input with `x.astype(jnp.{own})`."
            ) from e
        return out.astype(x.dtype)
