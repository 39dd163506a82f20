"""Progress meters for iterative solves: `AbstractProgressMeter`,
`NoProgressMeter`, `TextProgressMeter`, `TqdmProgressMeter`.

A meter is used as `state = meter.init()`, then `state = meter.step(state,
progress)` with `progress` in `[0, 1]` inside the (possibly compiled, batched or
differentiated) solve, then `meter.close(state)`.

Tracing `init` creates a `_Screen`: the host-side end of the display, which the state
carries as static data. The program drives it through host callbacks whose
operands are first reduced over every `vmap` axis (so a batched solve shows one
display, following its slowest element) and cut off from differentiation. A token
passed from callback to callback orders them: open, each refresh, close.
"""

from __future__ import annotations

import abc
import importlib.util
import threading
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from .._module import Module, field
from .._unvmap import unvmap_max

_TOKEN = jax.ShapeDtypeStruct((), jnp.int32)


def _collapse(x: Any, *, slowest: bool = False) -> Any:
    """`x` as a single scalar, the same for every batch element: its maximum over
    every `vmap` axis (minimum if `slowest`), without a derivative."""
    x = jax.lax.stop_gradient(jnp.asarray(x))
    return -unvmap_max(-x) if slowest else unvmap_max(x)


class _Display(Protocol):
    def show(self, fraction: float) -> None: ...

    def close(self) -> None: ...


class _Screen:
    """The host side of a meter's display. One is made each time `init` is traced;
    each run of the traced program opens a display on it (ending one a previous run
    left open) and `close` ends it. Refreshes arriving while none is open (a step
    recomputed on a backward pass, say) are ignored."""

    def __init__(self, make: Callable[[], _Display]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._display: _Display | None = None

    def _end(self) -> None:
        if self._display is not None:
            self._display.close()
            self._display = None

    def _host_open(self) -> np.ndarray:
        with self._lock:
            self._end()
            self._display = self._make()
        return np.zeros((), np.int32)

    def _host_refresh(self, fraction: np.ndarray, token: np.ndarray) -> np.ndarray:
        with self._lock:
            if self._display is not None:
                self._display.show(float(fraction))
        return token

    def _host_close(self, token: np.ndarray) -> None:
        del token
        with self._lock:
            self._end()

    def open(self) -> Any:
        """Open the display when the program runs; returns the first token."""
        return io_callback(self._host_open, _TOKEN)

    def refresh(self, token: Any, fraction: Any) -> Any:
        """Show `fraction` (unbatched) after `token`'s callbacks; a new token.

        A pure callback, as the meters call it under `lax.cond`, which `vmap`
        refuses for effectful callbacks; its token is used, so it is kept, and a
        run repeated (on a backward pass) after `close` shows nothing."""
        return jax.pure_callback(
            self._host_refresh, _TOKEN, fraction, token, vmap_method="sequential"
        )

    def close(self, token: Any) -> None:
        io_callback(self._host_close, None, _collapse(token))


class AbstractProgressMeter(Module):
    """How far an iterative solve has got, shown as it runs."""

    @abc.abstractmethod
    def init(self) -> Any:
        """The meter's initial state."""

    @abc.abstractmethod
    def step(self, state: Any, progress: Any) -> Any:
        """Show `progress` (in `[0, 1]`); returns the new state."""

    @abc.abstractmethod
    def close(self, state: Any) -> None:
        """End the display."""


class NoProgressMeter(AbstractProgressMeter):
    """Shows nothing."""

    def init(self) -> None:
        return None

    def step(self, state: Any, progress: Any) -> Any:
        return state

    def close(self, state: Any) -> None:
        return None


class _Lines:
    """Text display: a line per refresh, and `100.00%` at the end if not yet shown."""

    def __init__(self) -> None:
        self.last = 0.0
        print("0.00%")

    def show(self, fraction: float) -> None:
        self.last = fraction
        print(f"{100 * fraction:.2f}%")

    def close(self) -> None:
        if self.last != 1:
            print("100.00%")


class _TextState(Module):
    progress: Any  # the fraction last shown
    token: Any
    screen: _Screen = field(static=True)


class TextProgressMeter(AbstractProgressMeter):
    """Prints the percentage done (`0.00%`, ..., `100.00%`), a line each time it has
    grown by more than `minimum_increase` (default 2%), and when it reaches 100%."""

    minimum_increase: Any = 0.02

    def init(self) -> _TextState:
        screen = _Screen(_Lines)
        return _TextState(jnp.zeros((), jnp.float32), screen.open(), screen)

    def step(self, state: _TextState, progress: Any) -> _TextState:
        now = _collapse(progress, slowest=True).astype(jnp.float32)
        shown = _collapse(state.progress)
        token = _collapse(state.token)
        due = (now - shown > self.minimum_increase) | (now == 1)
        shown, token = jax.lax.cond(
            due,
            lambda: (now, state.screen.refresh(token, now)),
            lambda: (shown, token),
        )
        return _TextState(shown, token, state.screen)

    def close(self, state: _TextState) -> None:
        state.screen.close(state.token)


class _Bar:
    """tqdm display, in percent."""

    def __init__(self) -> None:
        import tqdm  # pyright: ignore[reportMissingModuleSource]

        self.bar = tqdm.tqdm(
            total=100,
            unit="%",
            bar_format="{percentage:.2f}%|{bar}| [{elapsed}<{remaining}]",
        )

    def show(self, fraction: float) -> None:
        self.bar.n = round(100 * fraction, 2)
        self.bar.update(n=0)

    def close(self) -> None:
        self.show(1.0)
        self.bar.close()


class _TqdmState(Module):
    count: Any  # steps taken
    token: Any
    screen: _Screen = field(static=True)


class TqdmProgressMeter(AbstractProgressMeter):
    """A tqdm progress bar (needs `tqdm` installed), refreshed every
    `refresh_steps` steps."""

    refresh_steps: int = 20

    def __check_init__(self) -> None:
        if importlib.util.find_spec("tqdm") is None:
            raise ValueError(
                "`TqdmProgressMeter` needs `tqdm`: install it with `pip install tqdm`."
            )

    def init(self) -> _TqdmState:
        screen = _Screen(_Bar)
        return _TqdmState(jnp.zeros((), jnp.int32), screen.open(), screen)

    def step(self, state: _TqdmState, progress: Any) -> _TqdmState:
        count = _collapse(state.count)
        token = _collapse(state.token)
        token = jax.lax.cond(
            count % self.refresh_steps == 0,
            lambda: state.screen.refresh(token, _collapse(progress, slowest=True)),
            lambda: token,
        )
        return _TqdmState(count + 1, token, state.screen)

    def close(self, state: _TqdmState) -> None:
        state.screen.close(state.token)
