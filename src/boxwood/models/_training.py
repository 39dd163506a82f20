"""What training needs of the models, one mechanism for every family: the
initialisers `transformers` draws a freshly built model with (`N(0,
initializer_range)` weights, zero biases, a zeroed padding row, ViT's
truncated draws), on boxwood's fast initialisation path; and dropout's keys
(the check that a model in training mode is given one, the warning that a key
given to a model in inference mode drops nothing, and the keys of its parts and
layers)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .. import _init
from .._init import LAYER, PART, Initializer, fold_key, split_keys_of, stream_key
from .._warnings import user_stacklevel
from ..nn import Dropout, Embedding, Linear, Stacked

# Initialisation


def zeros(key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """The zero initialiser (biases), made on the host (no compile); under an
    abstract build (`filter_eval_shape`) a traced zero array."""
    if isinstance(key, jax.core.Tracer):
        return jnp.zeros(shape, dtype)
    return _init.zeros(shape, dtype)


def normal(std: float) -> Initializer:
    """The initialiser `N(0, std)` (`std`: the config's `initializer_range`):
    `jax.nn.initializers.normal`, which boxwood's layers draw on their fast path
    without a compile per shape; zeros for `std == 0`."""
    return jax.nn.initializers.normal(float(std)) if std > 0 else zeros


def truncated(std: float) -> Initializer:
    """`N(0, std)` cut off at -2 and 2 (absolute bounds, not standard
    deviations: for a small `std`, a plain normal), as `transformers` draws
    ViT's class token and position embeddings; zeros for `std == 0`."""
    if std <= 0:
        return zeros
    return jax.nn.initializers.truncated_normal(std, lower=-2 / std, upper=2 / std)


def draw(init: Initializer, key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """`init(key, shape, dtype)` on the layers' fast path, for an array that is
    no `boxwood.nn` layer's parameter (ViT's class token, GPT-2's `Conv1D`
    weight, stored in the file's `(in, out)` layout)."""
    return _init.init_param(init, lambda: None, key, shape, dtype, "init", "draw")


def zero_row(table: Any, row: int | None) -> Any:
    """`table` with row `row` zeroed (an embedding's padding row, as
    `torch.nn.Embedding(padding_idx=row)` starts it); `table` itself where `row`
    is `None` or outside it. On the host when concrete (no compile for the
    scatter)."""
    if row is None or not 0 <= row < table.shape[0]:
        return table
    if isinstance(table, jax.core.Tracer):
        return table.at[row].set(0)
    host = np.array(table)  # a copy
    host[row] = 0
    return jax.device_put(host)


def linear(
    n_in: int, n_out: int, dtype: Any, std: float, *, key: Any, bias: bool = True
) -> Linear:
    """A `Linear` layer as `transformers` initialises one: weight `N(0, std)`,
    bias (if any) zeros."""
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
    """An `Embedding` as `transformers` initialises one: `N(0, std)`, with the
    row `padding_row` (the config's `pad_token_id`, where the model's embedding
    has a padding index) zeroed."""

    def table(k: Any, shape: tuple[int, ...], dt: Any) -> Any:
        return zero_row(draw(normal(std), k, shape, dt), padding_row)

    return Embedding(n, size, dtype=dtype, weight_init=table, key=key)


# Dropout


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


# the model classes already warned of a key given in inference mode: once each
_KEY_IN_INFERENCE_WARNED: set[type] = set()


def dropout_key(model: Any, key: Any, call: str) -> Any:
    """`key` for a call of `model`, checked: a model whose dropout is active (in
    training mode, a rate above 0) needs one, and raises the `RuntimeError`
    `boxwood.nn.Dropout` raises without one, naming the model, `call` (how to
    pass `key=`) and `boxwood.nn.inference_mode`. `None` where no dropout is
    active, so that a call with a key and one without share one program.

    A key given to a model in inference mode whose config has dropout warns
    (once per class): a training loop ported from PyTorch (`model.train()`)
    would otherwise fine-tune a loaded model without dropout, silently."""
    layers = dropouts(model)
    rates = sorted({d.p for d in layers if active(d)})
    if not rates:
        if key is not None and any(d.p > 0 for d in layers):
            _warn_key_in_inference(model)
        return None
    if key is None:
        raise RuntimeError(
            f"{type(model).__name__} is in training mode (`inference=False`) with "
            f"dropout (rates {', '.join(f'{p:g}' for p in rates)} from its config) "
            f"and needs a random key: call it as `{call}` (a new key each step). "
            "To switch dropout off, switch the model to inference with "
            "`model = boxwood.nn.inference_mode(model)` (`from_pretrained` "
            "returns a model in inference mode)."
        )
    return key


def _warn_key_in_inference(model: Any) -> None:
    cls = type(model)
    if cls in _KEY_IN_INFERENCE_WARNED:
        return
    _KEY_IN_INFERENCE_WARNED.add(cls)
    warnings.warn(
        f"{cls.__name__} was given a dropout `key` but is in inference mode (as "
        "`from_pretrained` returns it, `transformers`' `eval()`), so it applies "
        "no dropout. To train with its config's dropout, switch it to training "
        "mode first: `model = boxwood.nn.inference_mode(model, False)` (PyTorch's "
        "`model.train()`). (Warned once per model class.)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def split(key: Any, n: int) -> tuple[Any, ...]:
    """`n` keys from `key` for a layer's parts (through `stream_key`; with rbg
    masks a hash of its words, no draw), or `n` times `None` without one."""
    if key is None:
        return (None,) * n
    return tuple(split_keys_of(stream_key(key), n, PART))


def layer_key(key: Any, layer: Any) -> Any:
    """Layer `layer`'s key (`layer` may be a traced index, inside the scan over
    the layers; through `stream_key`, as `split`), or `None` without a key."""
    return None if key is None else fold_key(stream_key(key), layer, LAYER)


def scan_layers(
    layers: Stacked,
    call: Callable[[Any, Any, Any], Any],
    x: Any,
    key: Any,
    every_layer: bool = False,
) -> Any:
    """`x` through the stacked `layers` in one scan, layer `i` called as
    `call(layer, x, layer_key(key, i))`; with `every_layer`, `(output, every)`,
    where `every` is `x` and each layer's output, `(depth + 1, *x.shape)`
    (`transformers`' `hidden_states`)."""

    def step(layer: Any, h: Any, i: Any) -> tuple[Any, Any]:
        out = call(layer, h, layer_key(key, i))
        return out, (out if every_layer else None)

    index = jnp.arange(layers.depth, dtype=jnp.int32)
    out, ys = layers.scan(step, x, index)
    if every_layer:
        return out, jnp.concatenate([x[None], ys.astype(x.dtype)])
    return out
