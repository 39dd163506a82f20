"""Recurrent cells: `GRUCell` and `LSTMCell`, one time step each."""

from __future__ import annotations

from typing import Any

import jax.nn as jnn
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._init import split_keys
from .._module import Module, field
from ._checks import check_input, layer_name
from ._misc import resolve_dtype, uniform_bound, uniform_init


def _check_step(cell: Any, x: Any, h: Any, what: str = "hidden") -> None:
    name = layer_name(cell, "input_size", "hidden_size")
    check_input(x, (cell.input_size,), name)
    check_input(h, (cell.hidden_size,), name, what=what)


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
        bound = uniform_bound(hidden_size)
        ikey, hkey, bkey, nkey = split_keys(key, 4)
        self.weight_ih = uniform_init(ikey, (3 * hidden_size, input_size), dtype, bound)
        self.weight_hh = uniform_init(
            hkey, (3 * hidden_size, hidden_size), dtype, bound
        )
        if use_bias:
            self.bias = uniform_init(bkey, (3 * hidden_size,), dtype, bound)
            self.bias_n = uniform_init(nkey, (hidden_size,), dtype, bound)
        else:
            self.bias = None
            self.bias_n = None
        self.input_size = input_size
        self.hidden_size = hidden_size
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
        gi = self.weight_ih @ input
        gh = self.weight_hh @ hidden
        if self.bias is not None:  # use_bias
            gi = gi + self.bias
        i_r, i_z, i_n = jnp.split(gi, 3)
        h_r, h_z, h_n = jnp.split(gh, 3)
        if self.bias_n is not None:  # use_bias
            h_n = h_n + self.bias_n
        r = jnn.sigmoid(i_r + h_r)
        z = jnn.sigmoid(i_z + h_z)
        n = jnp.tanh(i_n + r * h_n)
        return n + z * (hidden - n)


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
        bound = uniform_bound(hidden_size)
        ikey, hkey, bkey = split_keys(key, 3)
        self.weight_ih = uniform_init(ikey, (4 * hidden_size, input_size), dtype, bound)
        self.weight_hh = uniform_init(
            hkey, (4 * hidden_size, hidden_size), dtype, bound
        )
        self.bias = (
            uniform_init(bkey, (4 * hidden_size,), dtype, bound) if use_bias else None
        )
        self.input_size = input_size
        self.hidden_size = hidden_size
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
        gates = self.weight_ih @ input + self.weight_hh @ h
        if self.bias is not None:  # use_bias
            gates = gates + self.bias
        i, f, g, o = jnp.split(gates, 4)
        c = jnn.sigmoid(f) * c + jnn.sigmoid(i) * jnp.tanh(g)
        h = jnn.sigmoid(o) * jnp.tanh(c)
        return h, c
