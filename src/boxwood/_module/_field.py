"""`field()`, the `dataclasses.field` wrapper that knows about `static` and `converter`."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any


def field(
    *,
    converter: Callable[[Any], Any] | None = None,
    static: bool = False,
    **kwargs: Any,
) -> Any:
    """Declare a field of a [`boxwood.Module`][].

    **Arguments:**

    - `converter`: called on the field's value after `__init__` has run (for example
      `converter=jnp.asarray`). It is not called when a pytree is rebuilt by
      `jax.tree_util` (unflattening never re-runs initialisation).
    - `static`: if `True` the value is part of the pytree *structure* (the treedef)
      rather than a leaf. Static values should not be arrays (a warning when the
      module is built): they are compared with `==` when compiled code is looked
      up.
    - `**kwargs`: passed on to `dataclasses.field` (`default`, `default_factory`,
      `init`, `repr`, `metadata`, ...).

    **Example:**

    ```python
    class Dropout(boxwood.Module):
        p: float = boxwood.field(static=True, default=0.5)
    ```
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    if converter is not None:
        if not callable(converter):
            raise TypeError(
                f"`field(converter=...)` must be callable, got {type(converter).__name__}."
            )
        metadata["converter"] = converter
    if static:
        metadata["static"] = True
    return dataclasses.field(metadata=metadata, **kwargs)


def is_static(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("static", False))


def converter_of(f: dataclasses.Field) -> Callable[[Any], Any] | None:
    return f.metadata.get("converter")


def static_field(**kwargs: Any) -> Any:
    """Deprecated: use `field(static=True, ...)`. Kept for code written for Equinox.

    **Arguments:**

    - `**kwargs`: as for [`boxwood.field`][].

    **Returns:**

    `field(static=True, **kwargs)`, after a `DeprecationWarning`.
    """
    warnings.warn(
        "`static_field(...)` is deprecated; use `boxwood.field(static=True, ...)`.",
        DeprecationWarning,
        stacklevel=2,
    )
    return field(static=True, **kwargs)
