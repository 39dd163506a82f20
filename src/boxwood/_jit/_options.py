"""`JitOptions`: every option of a `filter_jit` wrapper that changes its compiled
code, its calling convention or what its traces do (donation, recompile
explanations, the keywords passed to the inner `jax.jit`).

It is the one place where such options are collected: `filter_jit` validates them
into a `JitOptions`, its `key` is part of the key of the compiled-code store
(`_cache.store_for`), so two wrappers of one function with different options
never share compiled code, and `jit_kwargs()` is what the inner `jax.jit` receives
(`_dispatch.Dispatch.jit`). A new option goes here (and, if it is a pytree
prefix of the arguments such as a sharding, into `Dispatch.jit_options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

#: `filter_jit(donate=...)`: what is donated, and whether JAX's warning is kept
Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]
DONATE_MODES: tuple[str, ...] = get_args(Donate)
#: `filter_jit(capture=...)`: what the function reads from its globals and closure
Capture = Literal["inputs", "constants"]
CAPTURE_MODES: tuple[str, ...] = get_args(Capture)


# `jax.jit` keywords passed through to the inner `jax.jit` as they are
PASSED_THROUGH = frozenset(
    {"keep_unused", "inline", "compiler_options", "device", "backend"}
)
# `jax.jit` keywords given as pytree prefixes, translated first (`_shardings.py`)
TRANSLATED = frozenset({"in_shardings", "out_shardings"})
# `jax.jit` keywords that do not apply to `filter_jit`, and what to do instead
NOT_APPLICABLE = {
    "static_argnums": "there is no `static_argnums`: non-array arguments are static "
    "automatically (pass `jnp.asarray(...)` to trace a number)",
    "static_argnames": "there is no `static_argnames`: non-array arguments are static "
    "automatically (pass `jnp.asarray(...)` to trace a number)",
    "donate_argnums": "use `donate=` ('all', 'all-except-first', 'warn', ...)",
    "donate_argnames": "use `donate=` ('all', 'all-except-first', 'warn', ...)",
}


def check_jit_kwargs(jit_kwargs: dict) -> None:
    """Raise a `TypeError` naming each keyword that `filter_jit` cannot pass on."""
    problems = []
    for name in sorted(set(jit_kwargs) - PASSED_THROUGH - TRANSLATED):
        fix = NOT_APPLICABLE.get(name)
        if fix is None:
            fix = (
                "not a `jax.jit` keyword that filter_jit accepts (it passes on "
                f"{', '.join(sorted(PASSED_THROUGH))})"
            )
        problems.append(f"`{name}`: {fix}")
    if problems:
        raise TypeError(
            f"`filter_jit` got unexpected keyword argument(s) {sorted(set(jit_kwargs) - PASSED_THROUGH - TRANSLATED)}. "
            + "; ".join(problems)
            + "."
        )


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an option value: containers by content, other
    hashable values as they are, anything else by identity (the options keep the
    value alive, so the identity stays valid)."""
    if isinstance(value, Mapping):
        return (
            "mapping",
            tuple(sorted((repr(k), _freeze(v)) for k, v in value.items())),
        )
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


class JitOptions:
    """The validated options of one `filter_jit` wrapper (see the module docstring).

    **Arguments:**

    - `donate`: one of `DONATE_MODES`.
    - `explain`: `True`/`False`, or `None` for `boxwood.config.explain_recompiles`.
    - `jit_kwargs`: keyword arguments for the inner `jax.jit`.
    - `capture`: `"inputs"` or `"constants"`. Part of the key although the compiled
      code of a function that reads nothing watched is the same in both: a trace
      in `"inputs"` mode also warns about globals read by methods of module
      arguments (`_capture/_arguments.py`), which a trace shared with a
      `"constants"` wrapper would skip.
    """

    __slots__ = ("donate", "explain", "_jit_kwargs", "key", "except_first", "capture")

    def __init__(
        self,
        donate: Donate,
        explain: bool | None,
        jit_kwargs: dict,
        capture: Capture = "inputs",
    ) -> None:
        self.donate = donate
        self.explain = explain
        self.capture = capture
        self._jit_kwargs = dict(jit_kwargs)
        self.except_first = donate.endswith("except-first")
        self.key = (donate, explain, _freeze(self._jit_kwargs), capture)

    def jit_kwargs(self) -> dict[str, Any]:
        """A fresh dict of the keyword arguments for the inner `jax.jit`."""
        return dict(self._jit_kwargs)

    @property
    def donates(self) -> bool:
        return self.donate != "none"

    @property
    def warns_undonated(self) -> bool:
        return self.donate.startswith("warn")
