"""`MLP`."""

from collections.abc import Callable
from typing import Any, Literal, cast

import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from ._callables import call_per_neuron, copy_per_neuron, store_callable
from ._defaults import resolve_dtype
from ._input_checks import check_input, layer_name
from ._linear import Linear


def _identity(x: Any) -> Any:
    return x


class MLP(Module):
    """A multi-layer perceptron (feed-forward network): `depth` hidden layers of
    size `width_size`, each a [`boxwood.nn.Linear`][] followed by `activation`, then
    an output `Linear` followed by `final_activation`.

    Same signature as `equinox.nn.MLP`. An activation may be a plain function (held
    as static structure, so the model holds only arrays and `jax.jit(model)` works)
    or a learnt one such as [`boxwood.nn.PReLU`][]: as in Equinox, a learnt
    activation gets its own copy of its parameters for every neuron (`activation`'s
    arrays get leading axes `(depth, width_size)`, `final_activation`'s
    `(out_size,)`) and is applied entry by entry. A plain function is applied to
    the whole vector (Equinox applies it entry by entry; the two agree for
    elementwise functions such as `relu`).

    >>> import boxwood.nn, jax, jax.numpy as jnp
    >>> mlp = boxwood.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(0))
    >>> mlp(jnp.ones(3)).shape
    (2,)
    """

    layers: tuple[Linear, ...]
    activation: Callable
    final_activation: Callable
    use_bias: bool = field(static=True)
    use_final_bias: bool = field(static=True)
    in_size: int | Literal["scalar"] = field(static=True)
    out_size: int | Literal["scalar"] = field(static=True)
    width_size: int = field(static=True)
    depth: int = field(static=True)
    scan: bool = field(static=True, default=False)

    def __init__(
        self,
        in_size: int | Literal["scalar"],
        out_size: int | Literal["scalar"],
        width_size: int,
        depth: int,
        activation: Callable = jax.nn.relu,
        final_activation: Callable = _identity,
        use_bias: bool = True,
        use_final_bias: bool = True,
        dtype: Any = None,
        *,
        scan: bool = False,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `in_size`: the input size; the input has shape `(in_size,)`, or `()` if
            `in_size="scalar"`.
        - `out_size`: the output size; the output has shape `(out_size,)`, or `()` if
            `out_size="scalar"`.
        - `width_size`: the size of each hidden layer.
        - `depth`: the number of hidden layers. `depth=0` is a single
            `Linear(in_size, out_size)`; `depth=1` is `Linear(in_size, width_size)`
            then `Linear(width_size, out_size)`; and so on.
        - `activation`: the function applied after each hidden layer: a plain,
            hashable function, or a module with parameters (copied per neuron).
            Defaults to `jax.nn.relu`.
        - `final_activation`: the function applied after the output layer (as for
            `activation`). Defaults to the identity.
        - `use_bias`: whether the hidden layers have biases.
        - `use_final_bias`: whether the output layer has a bias.
        - `dtype`: dtype of every weight and bias. Defaults to `float32`.
        - `scan`: if `True`, the `depth - 1` width-to-width layers are stored stacked
            (one `Linear` whose arrays have a leading axis) and run with
            `jax.lax.scan`, which compiles faster for deep networks. (Keyword only.)
        - `key`: a `jax.random` key for the initialisation. (Keyword only.)
        """
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"MLP: `depth` must be a non-negative int, got {depth!r}.")
        activation = store_callable(activation, "MLP: `activation`")
        final_activation = store_callable(final_activation, "MLP: `final_activation`")
        dtype = resolve_dtype(dtype, "MLP")
        self.in_size, self.out_size = in_size, out_size
        self.width_size, self.depth, self.scan = width_size, depth, bool(scan)
        self.use_bias, self.use_final_bias = bool(use_bias), bool(use_final_bias)
        self.layers = _layers(self, dtype, key)
        self.activation = copy_per_neuron(activation, (depth, width_size))
        self.final_activation = (
            final_activation
            if out_size == "scalar"
            else copy_per_neuron(final_activation, (out_size,))
        )

    def __call__(
        self, x: Float[Array, " in_size"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, " out_size"]:
        """**Arguments:**

        - `x`: an array of shape `(in_size,)` (or `()` if `in_size="scalar"`).
        - `key`: ignored. (Keyword only.)

        **Returns:**

        An array of shape `(out_size,)` (or `()` if `out_size="scalar"`).
        """
        del key
        expected = () if self.in_size == "scalar" else (self.in_size,)
        check_input(x, expected, layer_name(self, "in_size", "out_size"))
        *hidden, last = self.layers
        if self.scan and self.depth > 0:
            first, stacked = hidden
            x = call_per_neuron(self.activation, first(x), 0)

            def step(h: Array, i_layer: tuple[Array, Linear]) -> tuple[Array, None]:
                i, layer = i_layer
                return call_per_neuron(self.activation, layer(h), i), None

            x, _ = jax.lax.scan(step, x, (jnp.arange(1, self.depth), stacked))
        else:
            for i, layer in enumerate(hidden):
                x = call_per_neuron(self.activation, layer(x), i)
        x = last(jnp.asarray(x))
        if self.out_size == "scalar":
            return self.final_activation(x)
        return call_per_neuron(self.final_activation, x)


def _layers(mlp: MLP, dtype: Any, key: PRNGKeyArray) -> tuple[Linear, ...]:
    """The `Linear` layers of `mlp`, whose size, bias and `scan` fields are already
    set."""
    in_size, out_size = mlp.in_size, mlp.out_size
    width, depth = mlp.width_size, mlp.depth
    # A vmapped (scan) build needs the keys as one array; otherwise split on the
    # host, with no compile per `depth` (the same keys either way).
    keys = jr.split(key, depth + 1) if mlp.scan else split_keys(key, depth + 1)
    if depth == 0:
        return (Linear(in_size, out_size, mlp.use_final_bias, dtype, key=keys[0]),)

    def hidden(k: PRNGKeyArray) -> Linear:
        return Linear(width, width, mlp.use_bias, dtype, key=k)

    layers = [Linear(in_size, width, mlp.use_bias, dtype, key=keys[0])]
    if mlp.scan:
        layers.append(jax.vmap(hidden)(cast(Array, keys)[1:depth]))
    else:
        layers.extend(hidden(k) for k in keys[1:depth])
    layers.append(Linear(width, out_size, mlp.use_final_bias, dtype, key=keys[-1]))
    return tuple(layers)
