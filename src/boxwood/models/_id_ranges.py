"""Range checks of integer id arrays (`input_ids`, BERT's `token_type_ids`, the
losses' `labels`): an id indexes an embedding table (or picks a log-probability),
where JAX would clamp one past the end to the last row and wrap a negative one
around, silently.

`ids_known_in_range()` marks a trace whose ids are in range by construction
(`generate`'s loop: a prompt checked before tracing, and sampled tokens): the
traced check, a host callback, is then left out, so that the compiled program
can be written to JAX's persistent compilation cache."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._errors import error_if

#: Labels at this value do not count in the cross-entropy losses (PyTorch's
#: `ignore_index`, which `transformers` keeps).
IGNORE_INDEX = -100

# True while tracing code whose id arrays are known to lie in range. A context
# variable, not a global flag: each thread (and task) sees only its own setting.
_KNOWN_IN_RANGE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "boxwood_ids_known_in_range", default=False
)


@contextlib.contextmanager
def ids_known_in_range() -> Iterator[None]:
    """Within this block, traced ids given to `check_ids_below` are taken to be in
    range: no `error_if` is attached. Enter it only around the tracing of code
    that makes its ids itself, or whose ids were checked eagerly before tracing.
    Concrete ids are still checked, as are the dtypes. JAX reuses the trace of a
    function it has traced before, so a function traced here must always be
    traced here (as `generate`'s loop, which enters it itself)."""
    token = _KNOWN_IN_RANGE.set(True)
    try:
        yield
    finally:
        _KNOWN_IN_RANGE.reset(token)


def known_in_range() -> bool:
    """Whether this trace is within `ids_known_in_range()`: inputs checked
    eagerly before tracing (ids, and masks) need no traced check."""
    return _KNOWN_IN_RANGE.get()


def check_ids_below(
    model: str,
    argument: str,
    ids: jax.Array,
    size: int,
    option: str,
    rule: str | None = None,
) -> jax.Array:
    """`ids` (the model's argument `argument`, integers) must lie in `[0, size)`,
    `size` being the config option `option`; `rule` words the requirement in
    the error (default: the range and the option).

    On concrete arrays a bad id raises `ValueError` at once, naming the first one
    and its position; under a trace the check is a `boxwood.error_if` attached to
    the returned array, so use the result (inside `ids_known_in_range()`, traced
    ids are returned unchecked).
    """
    _check_integers(model, argument, ids)
    rule = rule or (
        f"{model}: `{argument}` must hold ids from 0 to {size - 1} "
        f"(`{option}` = {size} in the config)"
    )
    if isinstance(ids, jax.core.Tracer) and _KNOWN_IN_RANGE.get():
        return ids
    return _checked(ids, lambda v: (v < 0) | (v >= size), rule, "an id")


def check_labels(
    where: str,
    labels: jax.Array,
    size: int,
    kind: str,
    option: str,
    argument: str = "labels",
) -> jax.Array:
    """The labels of a loss (`where`, such as `"`causal_lm_loss`"`) must be ids
    in `[0, size)` or `IGNORE_INDEX`; `kind` names them (`"class ids"`) and
    `option` the config option that sets `size` (`"num_labels"`), `argument`
    the loss's argument that holds them. As
    `check_ids_below`: an eager `ValueError` naming the first bad label and its
    position, else a `boxwood.error_if` attached to the returned array (always:
    labels are never known to be in range)."""
    _check_integers(where, argument, labels)
    rule = (
        f"{where}: `{argument}` must hold {kind} from 0 to {size - 1} (`{option}` = "
        f"{size}), or {IGNORE_INDEX} for a position left out of the loss"
    )
    return _checked(
        labels,
        lambda v: (v != IGNORE_INDEX) & ((v < 0) | (v >= size)),
        rule,
        "a label",
        f". Set the label of an example without one (a GLUE test split's -1) to "
        f"{IGNORE_INDEX}, or leave the example out",
    )


def _check_integers(where: str, argument: str, ids: Any) -> None:
    dtype = jnp.result_type(ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(
            f"{where}: `{argument}` must be an integer array of ids, got dtype "
            f"{dtype}. Convert it with `.astype(jnp.int32)`."
        )


def _checked(ids: Any, outside: Any, rule: str, one: str, fix: str = "") -> Any:
    """`ids`, checked to have no entry where `outside(ids)`: at once for concrete
    `ids`, else by a `boxwood.error_if` on the returned array."""
    if isinstance(ids, jax.core.Tracer):
        message = f"{rule}; got {one} outside that range{fix}."
        checked: Any = error_if(ids, outside(ids), message)
        return checked
    values = np.asarray(ids)
    where = np.flatnonzero(outside(values))
    if where.size:
        first = int(where[0])
        at = tuple(int(i) for i in np.unravel_index(first, values.shape))
        raise ValueError(
            f"{rule}; got {int(values.reshape(-1)[first])} at position "
            f"{at[0] if len(at) == 1 else at} ({where.size} out of range in all)"
            f"{fix}."
        )
    return ids
