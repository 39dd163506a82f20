"""Progress meters for iterative solves: `AbstractProgressMeter`,
`NoProgressMeter`, `TextProgressMeter`, `TqdmProgressMeter`.

A meter is used as `state = meter.init()`, then `state = meter.step(state,
progress)` with `progress` in `[0, 1]` inside the (possibly compiled, possibly
batched) solve, then `meter.close(state)`. The displays live on the host, in a
registry keyed by an integer that the state carries through the program.
"""

from __future__ import annotations

import abc
import importlib.util
import itertools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from .._module import Module
from .._unvmap import unvmap_all, unvmap_max
from ._nontraceable import nonbatchable
from ._unvmap_prims import unvmap_max_p


class _Displays:
    """Host-side displays, by id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.displays: dict = {}

    def open(self, make: Callable[[], Any]) -> Any:
        def host() -> np.ndarray:
            with self.lock:
                key = next(self.ids)
                self.displays[key] = make()
            return np.array(key, np.int32)

        key = io_callback(host, jax.ShapeDtypeStruct((), jnp.int32))
        return nonbatchable(key)

    def update(self, show: Callable, progress: Any, key: Any) -> Any:
        progress = -unvmap_max_p.bind(-jnp.asarray(progress))  # the slowest element

        def host(p: Any, k: Any) -> Any:
            with self.lock:
                display = self.displays.get(int(np.unique(k)[0]))
                if display is not None:  # absent on a backward pass, say
                    show(display, float(np.asarray(p).reshape(-1)[0]))
            return k

        return jax.pure_callback(host, key, progress, key, vmap_method="expand_dims")

    def close(self, finish: Callable, key: Any) -> None:
        def host(k: Any) -> None:
            with self.lock:
                display = self.displays.pop(int(k), None)
            if display is not None:
                finish(display)

        io_callback(host, None, unvmap_max(key))


_displays = _Displays()


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


class _TextState(Module):
    progress: Any
    key: Any


def _print_percent(display: list, progress: float) -> None:
    display[0] = progress
    print(f"{100 * progress:.2f}%")


def _print_end(display: list) -> None:
    if display[0] != 1:
        print("100.00%")


def _text_open() -> list:
    print("0.00%")
    return [0.0]


class TextProgressMeter(AbstractProgressMeter):
    """Prints the percentage done (`0.00%`, ..., `100.00%`), a line each time it has
    grown by `minimum_increase` (default 2%)."""

    minimum_increase: Any = 0.02

    def init(self) -> _TextState:
        return _TextState(jnp.array(0.0), _displays.open(_text_open))

    def step(self, state: _TextState, progress: Any) -> _TextState:
        grown = (progress - state.progress > self.minimum_increase) | (progress == 1)
        show = nonbatchable(unvmap_all(grown))

        def update(key: Any) -> tuple:
            return progress, _displays.update(_print_percent, progress, key)

        new_progress, key = jax.lax.cond(
            show, update, lambda key: (state.progress, key), state.key
        )
        return _TextState(new_progress, key)

    def close(self, state: _TextState) -> None:
        _displays.close(_print_end, state.key)


class _TqdmState(Module):
    step: Any
    key: Any


def _tqdm_open() -> Any:
    import tqdm

    return tqdm.tqdm(
        total=100,
        unit="%",
        bar_format="{percentage:.2f}%|{bar}| [{elapsed}<{remaining}]",
    )


def _tqdm_show(bar: Any, progress: float) -> None:
    bar.n = round(100 * progress, 2)
    bar.update(n=0)


def _tqdm_end(bar: Any) -> None:
    bar.n = 100.0
    bar.update(n=0)
    bar.close()


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
        return _TqdmState(jnp.array(0), _displays.open(_tqdm_open))

    def step(self, state: _TqdmState, progress: Any) -> _TqdmState:
        due = nonbatchable(unvmap_max(state.step) % self.refresh_steps == 0)
        key = jax.lax.cond(
            due,
            lambda k: _displays.update(_tqdm_show, progress, k),
            lambda k: k,
            state.key,
        )
        return _TqdmState(state.step + 1, key)

    def close(self, state: _TqdmState) -> None:
        _displays.close(_tqdm_end, state.key)
