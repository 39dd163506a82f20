"""What training needs of the models: initialisers as `transformers` draws a
freshly built model (normal draws of standard deviation `initializer_range`, zero
biases, a zeroed padding row), on boxwood's fast initialisation path; and
dropout (each model's `boxwood.nn.Dropout` layers, the check that a model in
training mode is given a key, and the keys of the layers)."""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .. import _init
from ..nn import Dropout, Embedding, Linear


def normal(std: float) -> Any:
    """The initialiser `N(0, std)`: `jax.nn.initializers.normal`, which the fast
    path draws without a compile per shape."""
    return jax.nn.initializers.normal(float(std))


def zeros(key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """The zero initialiser, made on the host (no compile); under an abstract
    build (`filter_eval_shape`) a traced zero array."""
    if isinstance(key, jax.core.Tracer):
        return jnp.zeros(shape, dtype)
    return _init.zeros(shape, dtype)


def normal_array(key: Any, shape: tuple[int, ...], dtype: Any, std: float) -> Any:
    """An array of `N(0, std)` draws of `shape`, as drawn: for layers that store
    JAX's `(in, out)` layout themselves (GPT-2's `Conv1D`)."""
    return _init.init_param(normal(std), lambda: None, key, shape, dtype, "", "")


def linear(
    n_in: int, n_out: int, bias: bool, dtype: Any, std: float, *, key: Any
) -> Linear:
    """A `Linear` layer as `transformers` initialises one: weight `N(0, std)`,
    bias zeros."""
    return Linear(
        n_in,
        n_out,
        use_bias=bias,
        dtype=dtype,
        weight_init=normal(std),
        bias_init=zeros,
        key=key,
    )


def embedding(
    n: int, size: int, dtype: Any, std: float, *, key: Any, padding_row: Any = None
) -> Embedding:
    """An `Embedding` as `transformers` initialises one: `N(0, std)`, with the row
    `padding_row` (the config's `pad_token_id`, where the model's embedding has
    a padding index) zeroed."""

    def draw(k: Any, shape: tuple[int, ...], dt: Any) -> Any:
        table = _init.init_param(normal(std), lambda: None, k, shape, dt, "", "")
        if padding_row is None or not 0 <= padding_row < shape[0]:
            return table
        if isinstance(table, jax.core.Tracer):
            return table.at[padding_row].set(0)
        host = np.array(table)  # a copy: no compile for the scatter
        host[padding_row] = 0
        return jax.device_put(host)

    return Embedding(n, size, dtype=dtype, weight_init=draw, key=key)


def dropouts(tree: Any) -> list[Dropout]:
    """Every `Dropout` layer in `tree` (a model)."""
    return [
        x
        for x in jtu.tree_leaves(tree, is_leaf=lambda x: isinstance(x, Dropout))
        if isinstance(x, Dropout)
    ]


def active(dropout: Dropout) -> bool:
    """Whether `dropout` drops anything: in training mode, with `p > 0`."""
    return not dropout.inference and dropout.p > 0


def check_key(model: Any, key: Any, call: str) -> None:
    """A model in training mode with a nonzero dropout rate needs `key`: raise
    the error that says so, naming the rates and both fixes."""
    if key is not None:
        return
    rates = sorted({d.p for d in dropouts(model) if active(d)})
    if rates:
        name = type(model).__name__
        raise RuntimeError(
            f"{name} is in training mode (`inference=False`) with dropout (rates "
            f"{', '.join(f'{p:g}' for p in rates)} from its config) and needs a "
            f"random key: call it as `{call}`. To switch dropout off, switch the "
            "model to inference with `model = boxwood.nn.inference_mode(model)` "
            "(`from_pretrained` returns a model in inference mode)."
        )


def layer_key(key: Any, layer: Any) -> Any:
    """Layer `layer`'s key (a traced index, inside the scan over blocks), or
    `None` without a key."""
    return None if key is None else jax.random.fold_in(key, layer)


def split(key: Any, n: int) -> tuple[Any, ...]:
    """`n` keys from `key`, or `n` times `None`."""
    if key is None:
        return (None,) * n
    return tuple(jax.random.split(key, n))


def drop(dropout: Dropout, x: Any, key: Any) -> Any:
    """`dropout(x, key=key)`, where an inactive dropout needs no key."""
    return dropout(x, key=key) if active(dropout) else x
