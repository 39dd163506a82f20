"""What the encoder models (BERT and its heads, ViT) need to be trained: their
initialisation from `initializer_range` as `transformers` draws it, and the
random keys of their dropout."""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.random as jr
import numpy as np
from jaxtyping import PRNGKeyArray

from .._init import Initializer, init_param, zeros
from ..nn import Dropout, Linear, inference_mode
from ._config import ConfigError


def normal_init(std: float) -> Initializer:
    """`N(0, std)` (`initializer_range`), for linear weights and embedding
    tables; `jax.nn.initializers.normal`, which boxwood's layers draw on their
    fast path."""
    return jax.nn.initializers.normal(std) if std > 0 else zeros_init


def linear(config: Any, n_in: int, n_out: int, dtype: Any, key: PRNGKeyArray) -> Linear:
    """A `Linear` initialised as `transformers` initialises BERT's and ViT's:
    weight `N(0, initializer_range)`, bias zero."""
    init = normal_init(config.initializer_range)
    return Linear(
        n_in, n_out, dtype=dtype, weight_init=init, bias_init=zeros_init, key=key
    )


def truncated_init(std: float) -> Initializer:
    """`N(0, std)` cut off at `-2` and `2` (absolute bounds, not standard
    deviations: so for small `std` a plain normal), as `transformers` draws
    ViT's class token and position embeddings."""
    if std <= 0:
        return zeros_init
    return jax.nn.initializers.truncated_normal(std, lower=-2 / std, upper=2 / std)


def zeros_init(key: Any, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Zeros (biases), made on the host."""
    del key
    return zeros(shape, dtype)


def draw(init: Initializer, key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """`init(key, shape, dtype)` for an array that is no layer's parameter, on
    the layers' fast path."""
    return init_param(init, lambda: None, key, shape, dtype, "init", "draw")


def zero_row(table: Any, row: int | None) -> Any:
    """`table` with row `row` zeroed (an embedding's padding row, as
    `torch.nn.Embedding(padding_idx=row)` has it); on the host when concrete."""
    if row is None or not 0 <= row < table.shape[0]:
        return table
    if isinstance(table, jax.core.Tracer):
        return table.at[row].set(0)
    host = np.array(table)
    host[row] = 0
    return jax.device_put(host)


def in_training(model: Any) -> bool:
    """Whether some dropout of `model` is active (`p > 0`, not in inference)."""
    dropouts = jax.tree_util.tree_leaves(
        model, is_leaf=lambda x: isinstance(x, Dropout)
    )
    return any(isinstance(d, Dropout) and d.p > 0 and not d.inference for d in dropouts)


def check_key(model: Any, key: Any, where: str) -> None:
    """`ValueError` when `model` is in training mode but no `key` was given."""
    if key is None and in_training(model):
        raise ValueError(
            f"{where}: the model is in training mode (its dropout is active) and "
            "needs a random key: call it with `key=jax.random.key(...)` (a new one "
            "each step). For evaluation switch dropout off with "
            "`model = boxwood.nn.inference_mode(model)` (`from_pretrained` "
            "returns a model in inference mode)."
        )


def split_or_none(key: Any, count: int) -> tuple[Any, ...]:
    """`count` keys from `key`, or `count` `None`s without one."""
    if key is None:
        return (None,) * count
    return tuple(jr.split(key, count))


def layer_keys(key: Any, depth: int) -> Any:
    """One key per layer (stacked, for a scan), or `None`."""
    return None if key is None else jr.split(key, depth)


def loaded_for_inference(model: Any) -> Any:
    """`model` with every dropout switched off: the state `from_pretrained`
    returns a model in, as `transformers`' `from_pretrained` returns one in
    `eval()` mode."""
    return inference_mode(model)


def check_rates(config: Any, where: str, names: tuple[str, ...]) -> None:
    """`ConfigError` naming the first of the dropout rates `names` of `config`
    that is not a number in `[0, 1]` (`None` passes: unset)."""
    for name in names:
        rate = getattr(config, name)
        ok = rate is None or (
            isinstance(rate, (int, float))
            and not isinstance(rate, bool)
            and 0 <= rate <= 1
        )
        if not ok:
            raise ConfigError(
                f"{where}the option `{name}` = {rate!r} is not a dropout rate: it "
                "must be a number from 0 to 1."
            )
