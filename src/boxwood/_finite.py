"""Whether any array of a model holds NaN or Inf, for the display's first line and
`boxwood.summary(..., check_finite=True)`.

Reading an array's values waits for the computation that makes it and, on an
accelerator, copies it to the host. So the notebook display checks only when that
is cheap (a small model whose arrays are already computed, in host memory); a
larger one is checked on request.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._paths import leaves_with_dotted_paths

CHEAP_ELEMENTS = 1 << 20  # the display checks by itself up to this many elements
CHEAP_ARRAYS = 1000  # ... in at most this many arrays


@dataclasses.dataclass(frozen=True)
class FiniteReport:
    """`checked`: whether the values were read; `bad`: `(dotted path, NaN count,
    Inf count)` for each array holding NaN or Inf."""

    checked: bool
    bad: tuple[tuple[str, int, int], ...] = ()

    def text(self) -> str:
        if not self.checked:
            return (
                "NaN/Inf not checked (reading a large model or one on an accelerator "
                "waits for the device; boxwood.summary(model, check_finite=True) "
                "checks)"
            )
        if not self.bad:
            return "no NaN or Inf"
        named = ", ".join(
            f"{path or '(root)'} ({nan} NaN, {inf} Inf)"
            for path, nan, inf in self.bad[:5]
        )
        more = f" and {len(self.bad) - 5} more" if len(self.bad) > 5 else ""
        arrays = "array" if len(self.bad) == 1 else "arrays"
        return f"NaN/Inf in {len(self.bad)} {arrays}: {named}{more}"


def _floating(x: Any) -> bool:
    if isinstance(x, jax.core.Tracer):
        return False
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return jnp.issubdtype(x.dtype, jnp.inexact)  # bfloat16 too
    return False


def _in_host_memory_and_ready(x: Any) -> bool:
    if not isinstance(x, jax.Array):
        return True  # NumPy
    try:
        return (
            x.is_fully_addressable
            and all(d.platform == "cpu" for d in x.devices())
            and x.is_ready()  # pyright: ignore[reportAttributeAccessIssue]
        )
    except Exception:  # a deleted or donated buffer: do not touch it
        return False


def host_values(x: Any) -> np.ndarray:
    """The values of an array in host memory (waits for it; copies it from an
    accelerator). Every read of the NaN/Inf check goes through here."""
    return np.asarray(x)


def cheap_to_check(arrays: list[Any]) -> bool:
    """Whether reading `arrays` neither waits for a device nor copies much, and
    is quick: few arrays, few elements, all computed and in host memory."""
    if len(arrays) > CHEAP_ARRAYS:
        return False
    total = sum(int(np.prod(x.shape, dtype=np.int64)) for x in arrays)
    return total <= CHEAP_ELEMENTS and all(map(_in_host_memory_and_ready, arrays))


def _all_finite(x: Any) -> bool:
    try:
        return bool(np.isfinite(host_values(x)).all())
    except (RuntimeError, ValueError):  # a deleted, donated or remote buffer
        return True


def finite_report(tree: Any, check: bool | None) -> FiniteReport:
    """Check the floating-point arrays of `tree` for NaN and Inf: always when
    `check` is true, never when false, and when `check` is `None` only if that is
    cheap (`cheap_to_check`)."""
    arrays = [x for x in jax.tree_util.tree_leaves(tree) if _floating(x)]
    if check is None:
        check = cheap_to_check(arrays)
    if not check:
        return FiniteReport(checked=False)
    if all(map(_all_finite, arrays)):
        return FiniteReport(checked=True)
    bad = []  # rare: name and count what is wrong
    for path, x in leaves_with_dotted_paths(tree):
        if _floating(x) and not _all_finite(x):
            values = host_values(x)
            nan, inf = (
                np.count_nonzero(np.isnan(values)),
                np.count_nonzero(np.isinf(values)),
            )
            bad.append((path, int(nan), int(inf)))
    return FiniteReport(checked=True, bad=tuple(bad))
