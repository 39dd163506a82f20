"""Classification options and losses shared by the classifier models (BERT's
heads, ViT): the class labels of `config.json` (`id2label`, `label2id`,
`num_labels`), `problem_type`, and the loss `transformers` picks from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..nn import Linear
from . import _training as training
from ._id_ranges import IGNORE_INDEX, check_labels
from ._model_config import ConfigError

#: The `problem_type`s `transformers` knows; `None` lets the loss decide from
#: `num_labels` and the labels' dtype.
PROBLEM_TYPES = (
    None,
    "regression",
    "single_label_classification",
    "multi_label_classification",
)

#: What `read_labels` reads besides `id2label` and `label2id` (options of every
#: `config.json`).
LABEL_OPTIONS = frozenset({"num_labels"})


def default_labels(count: int) -> tuple[str, ...]:
    """`transformers`' names of `count` unnamed labels."""
    return tuple(f"LABEL_{i}" for i in range(count))


DEFAULT_LABELS = default_labels(2)


def read_labels(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`options` with `id2label`, `label2id` and `num_labels` replaced by one
    `labels` tuple (the names in id order): `id2label`'s names, else `num_labels`
    generic ones. Both given and disagreeing is a `ConfigError` naming both
    (`transformers` warns and keeps `id2label`'s count, or the last one set)."""
    options = dict(options)
    id2label = options.pop("id2label", None)
    options.pop("label2id", None)  # the inverse of `id2label`, written anew
    count = options.pop("num_labels", None)
    if count is not None and (
        isinstance(count, bool) or not isinstance(count, int) or count < 1
    ):
        raise ConfigError(
            f"{where}`num_labels` must be a positive integer, got {count!r}."
        )
    given = options.get("labels")  # the field itself (a config built in Python)
    if id2label is None:
        if given is not None and count is not None and len(given) != count:
            raise ConfigError(
                f"{where}`num_labels` = {count} disagrees with `labels`, which "
                f"names {len(given)} ({given!r}); give one of them."
            )
        if count is not None and given is None:
            options["labels"] = default_labels(count)
        return options
    try:
        ids = sorted(id2label, key=int)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}`id2label` must map label ids (integers) to names, got "
            f"{id2label!r}."
        ) from None
    options["labels"] = tuple(str(id2label[i]) for i in ids)
    if given is not None and tuple(given) != options["labels"]:
        raise ConfigError(
            f"{where}`labels` = {tuple(given)!r} disagrees with `id2label` = "
            f"{id2label!r}; give one of them."
        )
    if count is not None and count != len(ids):
        raise ConfigError(
            f"{where}`num_labels` = {count} disagrees with `id2label`, which names "
            f"{len(ids)} label{'s' if len(ids) != 1 else ''} ({id2label!r}). Give "
            "one of them: `id2label` (with the names; it sets the number), or "
            "`num_labels` alone (generic names LABEL_0, LABEL_1, ...)."
        )
    return options


def write_labels(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with its `labels` written as `transformers` writes them:
    `id2label` and `label2id`, left out when they are the default two."""
    options = dict(options)
    labels = tuple(options.pop("labels"))
    if labels != DEFAULT_LABELS:
        options["id2label"] = {str(i): name for i, name in enumerate(labels)}
        options["label2id"] = {name: i for i, name in enumerate(labels)}
    return options


def classifier_layer(
    config: Any, dtype: Any, key: Any, outputs: int | None = None
) -> Linear:
    """A classifier model's `classifier`: `config.hidden_size` to `outputs`
    (default `config.num_labels`) outputs, initialised as `transformers` does
    (weight `N(0, initializer_range)`, bias zero)."""
    count = config.num_labels if outputs is None else outputs
    return training.linear(
        config.hidden_size, count, dtype, config.initializer_range, key=key
    )


def check_problem_type(problem_type: Any, num_labels: int, where: str) -> None:
    """`ConfigError` unless `problem_type` is one of `PROBLEM_TYPES` and suits
    `num_labels`."""
    if problem_type not in PROBLEM_TYPES:
        raise ConfigError(
            f"{where}the option `problem_type` = {problem_type!r} is not one "
            f"`transformers` knows: {', '.join(map(repr, PROBLEM_TYPES))}."
        )
    if num_labels < 1:
        raise ConfigError(f"{where}a classifier needs at least one label.")


def problem_of(problem_type: str | None, num_labels: int, labels: Any) -> str:
    """The problem a loss solves, chosen as `transformers` chooses it when
    `problem_type` is unset: one label is a regression, integer labels are
    single-label classification, other (float) labels multi-label."""
    if problem_type is not None:
        return problem_type
    if num_labels == 1:
        return "regression"
    if jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        return "single_label_classification"
    return "multi_label_classification"


def classification_loss(
    logits: Float[Array, "*batch num_labels"],
    labels: Array,
    problem_type: str | None,
    where: str,
    classes: tuple[str, str] = ("class ids", "num_labels"),
    argument: str = "labels",
) -> Float[Array, ""]:
    """The mean loss of `logits` against `labels`, over every leading position:

    - `"regression"`: the squared error (`labels` shaped as `logits`, or without
      its last axis when there is one label);
    - `"single_label_classification"`: softmax cross entropy with integer class
      ids `labels` (shape `logits.shape[:-1]`), ids equal to `-100` left out (0
      when every id is `-100`, as `causal_lm_loss`); any other id outside
      `[0, num_labels)` raises (`check_labels`; `classes`, what the ids are and
      what counts them, and `argument`, the name of `labels`, word its
      message);
    - `"multi_label_classification"`: sigmoid binary cross entropy with
      `labels` of the shape of `logits` (targets in `[0, 1]`).

    `problem_type` `None` chooses as `problem_of` says.
    """
    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    num_labels = logits.shape[-1]
    problem = problem_of(problem_type, num_labels, labels)
    if problem == "single_label_classification":
        _check_label_shape(labels, logits.shape[:-1], where, classes[0], argument)
        if not jnp.issubdtype(labels.dtype, jnp.integer):
            raise TypeError(
                f"{where}: single-label classification takes integer class ids as "
                f"`{argument}`, got dtype {labels.dtype}."
            )
        labels = check_labels(where, labels, num_labels, *classes, argument)
        return _cross_entropy(logits, labels)
    if problem == "regression" and num_labels == 1 and labels.shape != logits.shape:
        labels = labels[..., None]
    _check_label_shape(labels, logits.shape, where, "targets")
    labels = labels.astype(jnp.result_type(logits.dtype, jnp.float32))
    logits = logits.astype(labels.dtype)
    if problem == "regression":
        return jnp.mean((logits - labels) ** 2)
    # log(1 + exp(-|x|)) + max(x, 0) - x * y: stable for either sign of x
    losses = jax.nn.softplus(-jnp.abs(logits)) + jnp.maximum(logits, 0)
    return jnp.mean(losses - logits * labels)


def _cross_entropy(logits: Array, labels: Array) -> Array:
    logits = logits.astype(jnp.result_type(logits.dtype, jnp.float32))
    counted = labels != IGNORE_INDEX
    safe = jnp.where(counted, labels, 0)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]
    total = jnp.sum(jnp.where(counted, -picked, 0.0))
    # a batch whose every label is ignored counts 0, not 0 / 0
    return total / jnp.maximum(jnp.sum(counted), 1).astype(total.dtype)


def _check_label_shape(
    labels: Array, shape: tuple, where: str, what: str, argument: str = "labels"
) -> None:
    if labels.shape != tuple(shape):
        raise ValueError(
            f"{where}: `{argument}` ({what}) must have shape {tuple(shape)}, got "
            f"{labels.shape}."
        )
