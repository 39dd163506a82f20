"""`Linear` and `Identity`."""

from typing import Any, Literal, TypeVar

import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import Initializer, check_initializer, init_param, split_keys
from .._module import Module, field
from ._defaults import resolve_dtype, uniform_bound, uniform_init
from ._input_checks import check_input, layer_name

_T = TypeVar("_T")


def weight_times(weight: Array, x: Array) -> Array:
    """`weight @ x` for a vector `x`, computed with `x` first in the product: under
    `jax.vmap` the product then puts the batch axes first, where its result
    keeps them, and neither it nor its two derivatives need a transpose
    (`weight @ x` put the features first and took two; `x @ weight.T` three).
    The layers' products (`Linear`, the recurrent cells) all go through here."""
    return jnp.tensordot(x, weight, axes=(-1, 1))


def _check_features(value: Any, arg: str) -> None:
    ok = value == "scalar" or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    )
    if not ok:
        raise ValueError(
            f'Linear: `{arg}` must be a non-negative int or the string "scalar", '
            f"got {value!r}."
        )


class Linear(Module):
    """Performs a linear transformation `weight @ x + bias`.

    Same signature as `equinox.nn.Linear`; the default initialisation matches
    PyTorch's `torch.nn.Linear`: weight and bias drawn from
    `U(-1/sqrt(in_features), 1/sqrt(in_features))`.

    >>> import boxwood.nn, jax, jax.numpy as jnp
    >>> linear = boxwood.nn.Linear(3, 2, key=jax.random.key(0))
    >>> linear(jnp.ones(3)).shape
    (2,)
    """

    weight: Float[Array, "out_features in_features"]
    bias: Float[Array, " out_features"] | None
    in_features: int | Literal["scalar"] = field(static=True)
    out_features: int | Literal["scalar"] = field(static=True)
    use_bias: bool = field(static=True)
    # how an initialiser sees each parameter (boxwood._init._layout)
    _init_layouts = {"weight": "dense"}

    def __init__(
        self,
        in_features: int | Literal["scalar"],
        out_features: int | Literal["scalar"],
        use_bias: bool = True,
        dtype: Any = None,
        *,
        weight_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `in_features`: the input size; the input is a vector of shape
            `(in_features,)`, or of shape `()` if `in_features="scalar"`.
        - `out_features`: the output size; the output is a vector of shape
            `(out_features,)`, or of shape `()` if `out_features="scalar"`.
        - `use_bias`: whether to add a bias.
        - `dtype`: dtype of the weight and bias (`float32`, `bfloat16`, ...).
            Defaults to `float32` (`float64` in JAX's 64-bit mode).
        - `weight_init`, `bias_init`: optional `(key, shape, dtype) -> array`
            functions (any `jax.nn.initializers` function) for the weight and the
            bias. As in JAX and Flax, the weight's initialiser is called with shape
            `(in_features, out_features)` (fan-in on axis -2) and its result is
            stored transposed, `(out_features, in_features)`; the bias's with
            `(out_features,)`. Default: PyTorch's uniform draw. (Keyword only.)
        - `key`: a `jax.random` key for the initialisation. (Keyword only.)
        """
        _check_features(in_features, "in_features")
        check_initializer(weight_init, "weight_init", "Linear")
        check_initializer(bias_init, "bias_init", "Linear")
        _check_features(out_features, "out_features")
        dtype = resolve_dtype(dtype, "Linear")
        n_in = 1 if in_features == "scalar" else in_features
        n_out = 1 if out_features == "scalar" else out_features
        bound = uniform_bound(n_in)
        wkey, bkey = split_keys(key)
        self.weight = init_param(
            weight_init,
            lambda: uniform_init(wkey, (n_out, n_in), dtype, bound),
            *(wkey, (n_out, n_in), dtype, "weight_init", "Linear", "dense"),
        )
        self.bias = (
            init_param(
                bias_init,
                lambda: uniform_init(bkey, (n_out,), dtype, bound),
                *(bkey, (n_out,), dtype, "bias_init", "Linear"),
            )
            if use_bias
            else None
        )
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bool(use_bias)

    def __call__(
        self, x: Float[Array, " in_features"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, " out_features"]:
        """**Arguments:**

        - `x`: an array of shape `(in_features,)` (or `()` if
            `in_features="scalar"`). For a batch, use `jax.vmap(linear)(xs)`.
        - `key`: ignored; accepted for a uniform layer API. (Keyword only.)

        **Returns:**

        An array of shape `(out_features,)` (or `()` if `out_features="scalar"`).
        """
        del key
        if self.in_features == "scalar":
            check_input(x, (), layer_name(self, "in_features"))
            x = jnp.reshape(x, (1,))
        else:
            check_input(x, (self.in_features,), layer_name(self, "in_features"))
        y = weight_times(self.weight, x)
        if self.bias is not None:
            y = y + self.bias
        if self.out_features == "scalar":
            y = jnp.reshape(y, ())
        return y


class Identity(Module):
    """Returns its input unchanged; a placeholder for another layer.

    Accepts (and ignores) any constructor arguments, as `equinox.nn.Identity` does.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        """**Arguments:** any; all are ignored."""
        del args, kwargs

    def __call__(self, x: _T, *, key: PRNGKeyArray | None = None) -> _T:
        """**Arguments:**

        - `x`: anything.
        - `key`: ignored. (Keyword only.)

        **Returns:**

        `x`, unchanged.
        """
        del key
        return x
