"""Recurrent cells: `GRUCell` and `LSTMCell`, one time step each."""

from __future__ import annotations

from typing import Any

import jax.nn as jnn
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from ._defaults import resolve_dtype, uniform_bound, uniform_init
from ._input_checks import check_input, layer_name
from ._linear import weight_times


def _check_step(cell: Any, x: Any, h: Any, what: str = "hidden") -> None:
    name = layer_name(cell, "input_size", "hidden_size")
    check_input(x, (cell.input_size,), name)
    check_input(h, (cell.hidden_size,), name, what=what)


def _cell_parameters(
    key: PRNGKeyArray,
    gates: int,
    input_size: int,
    hidden_size: int,
    dtype: Any,
    use_bias: bool,
) -> tuple[Array, Array, list[Array | None]]:
    """A recurrent cell's arrays as PyTorch initialises them, all from
    `U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))` with a key each: `weight_ih`,
    `weight_hh`, then the biases: `bias`, and for the GRU (3 gates) also `bias_n`
    (`None` without `use_bias`)."""
    rows = gates * hidden_size
    bias_shapes = [(rows,), (hidden_size,)] if gates == 3 else [(rows,)]
    keys = split_keys(key, 2 + len(bias_shapes))
    bound = uniform_bound(hidden_size)
    weight_ih = uniform_init(keys[0], (rows, input_size), dtype, bound)
    weight_hh = uniform_init(keys[1], (rows, hidden_size), dtype, bound)
    biases = [
        uniform_init(k, shape, dtype, bound) if use_bias else None
        for k, shape in zip(keys[2:], bias_shapes)
    ]
    return weight_ih, weight_hh, biases


def _with_bias(projection: Array, bias: Array | None) -> Array:
    return projection if bias is None else projection + bias


def _gru_blend(from_input: Array, from_hidden: Array, hidden: Array) -> Array:
    """The GRU's new hidden state from the `(3, hidden_size)` projections (rows:
    reset, update, candidate) of the input and of the old hidden state."""
    reset, update = jnn.sigmoid(from_input[:2] + from_hidden[:2])
    candidate = jnp.tanh(from_input[2] + reset * from_hidden[2])
    return candidate + update * (hidden - candidate)


class GRUCell(Module):
    """One step of a gated recurrent unit; the gates are those of `torch.nn.GRU`.

    With `(r, z, n)` the reset, update and new gates:

    ```
    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (1 - z) * n + z * h
    ```

    Layout (same as `equinox.nn.GRUCell`): `weight_ih` is `[W_ir; W_iz; W_in]`,
    shape `(3 * hidden_size, input_size)`, and `weight_hh` is `[W_hr; W_hz; W_hn]`,
    shape `(3 * hidden_size, hidden_size)`: exactly PyTorch's `weight_ih_l0` and
    `weight_hh_l0`. The two biases that PyTorch keeps for `r` and `z` are summed:
    `bias = [b_ir + b_hr; b_iz + b_hz; b_in]` and `bias_n = b_hn`.

    Initialisation as PyTorch: everything drawn from
    `U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))`. Run over a sequence with
    `jax.lax.scan(lambda h, x: (cell(x, h), h), h0, xs)`.
    """

    # how an initialiser sees each parameter (boxwood._init._layout)
    _init_layouts = {"weight_ih": "dense", "weight_hh": "dense"}
    weight_ih: Float[Array, "3*hidden_size input_size"]
    weight_hh: Float[Array, "3*hidden_size hidden_size"]
    bias: Float[Array, " 3*hidden_size"] | None
    bias_n: Float[Array, " hidden_size"] | None
    input_size: int = field(static=True)
    hidden_size: int = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `input_size`: size of the input at each step.
        - `hidden_size`: size of the hidden state.
        - `use_bias`: whether to use the biases.
        - `dtype`: dtype of the parameters; defaults to float32 (float64 in x64
          mode).
        - `key`: a `jax.random` key for the initialisation. (Keyword only.)
        """
        dtype = resolve_dtype(dtype, "GRUCell")
        drawn = _cell_parameters(key, 3, input_size, hidden_size, dtype, use_bias)
        self.weight_ih, self.weight_hh, (self.bias, self.bias_n) = drawn
        self.input_size, self.hidden_size = input_size, hidden_size
        self.use_bias = bool(use_bias)

    def __call__(
        self,
        input: Float[Array, " input_size"],
        hidden: Float[Array, " hidden_size"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " hidden_size"]:
        """**Arguments:**

        - `input`: shape `(input_size,)`.
        - `hidden`: shape `(hidden_size,)`.
        - `key`: ignored.

        **Returns:** the new hidden state, shape `(hidden_size,)`.
        """
        _check_step(self, input, hidden)
        from_input = _with_bias(weight_times(self.weight_ih, input), self.bias)
        from_input = from_input.reshape(3, -1)
        from_hidden = weight_times(self.weight_hh, hidden).reshape(3, -1)
        if self.bias_n is not None:  # use_bias: b_hn sits inside the reset product
            from_hidden = from_hidden.at[2].add(self.bias_n)
        return _gru_blend(from_input, from_hidden, hidden)


class LSTMCell(Module):
    """One step of a long short-term memory unit; the gates are those of
    `torch.nn.LSTM`.

    With `(i, f, g, o)` the input, forget, cell and output gates:

    ```
    i, f, g, o = split(W_ih x + W_hh h + b, 4)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')
    ```

    Layout (same as `equinox.nn.LSTMCell`): `weight_ih` is `[W_ii; W_if; W_ig;
    W_io]`, shape `(4 * hidden_size, input_size)`, and `weight_hh` likewise, shape
    `(4 * hidden_size, hidden_size)`: exactly PyTorch's `weight_ih_l0` and
    `weight_hh_l0`. PyTorch's two biases are summed: `bias = bias_ih_l0 +
    bias_hh_l0`.

    Initialisation as PyTorch: everything drawn from
    `U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))`. The hidden state is the pair
    `(h, c)`.
    """

    # how an initialiser sees each parameter (boxwood._init._layout)
    _init_layouts = {"weight_ih": "dense", "weight_hh": "dense"}
    weight_ih: Float[Array, "4*hidden_size input_size"]
    weight_hh: Float[Array, "4*hidden_size hidden_size"]
    bias: Float[Array, " 4*hidden_size"] | None
    input_size: int = field(static=True)
    hidden_size: int = field(static=True)
    use_bias: bool = field(static=True)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `input_size`: size of the input at each step.
        - `hidden_size`: size of the hidden state `h` and of the cell state `c`.
        - `use_bias`: whether to use a bias.
        - `dtype`: dtype of the parameters; defaults to float32 (float64 in x64
          mode).
        - `key`: a `jax.random` key for the initialisation. (Keyword only.)
        """
        dtype = resolve_dtype(dtype, "LSTMCell")
        drawn = _cell_parameters(key, 4, input_size, hidden_size, dtype, use_bias)
        self.weight_ih, self.weight_hh, (self.bias,) = drawn
        self.input_size, self.hidden_size = input_size, hidden_size
        self.use_bias = bool(use_bias)

    def __call__(
        self,
        input: Float[Array, " input_size"],
        hidden: tuple[Float[Array, " hidden_size"], Float[Array, " hidden_size"]],
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Float[Array, " hidden_size"], Float[Array, " hidden_size"]]:
        """**Arguments:**

        - `input`: shape `(input_size,)`.
        - `hidden`: the pair `(h, c)`, each of shape `(hidden_size,)`.
        - `key`: ignored.

        **Returns:** the new pair `(h, c)`.
        """
        if not isinstance(hidden, (tuple, list)) or len(hidden) != 2:
            raise ValueError(
                f"{layer_name(self, 'input_size', 'hidden_size')}: `hidden` must be "
                f"the pair `(h, c)`, got {type(hidden).__name__}."
            )
        h, c = hidden
        _check_step(self, input, h, what="hidden h")
        _check_step(self, input, c, what="cell state c")
        rows = _with_bias(
            weight_times(self.weight_ih, input) + weight_times(self.weight_hh, h),
            self.bias,
        )
        rows = rows.reshape(4, -1)  # input, forget, cell, output
        opened = jnn.sigmoid(rows)  # (row 2, the cell gate, is squashed by tanh)
        cell = opened[1] * c + opened[0] * jnp.tanh(rows[2])
        return opened[3] * jnp.tanh(cell), cell
