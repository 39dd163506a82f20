"""`while_loop(kind="bounded")`'s step bound and memory, and `scan`'s length
checks."""

import functools

import jax
import jax.numpy as jnp
import pytest

from boxwood.internal import scan, while_loop

_MAX_STEPS = [1, 2, 3, 4, 8, 9, 16, 17, 27, 28]


@functools.cache
def _steps_run(base):
    """`{max_steps: steps run}` for a loop that only the bound stops, each
    `max_steps` its own loop (the nesting of blocks depends on it), all of them
    traced into one program per `base` (one compile instead of ten)."""

    def run_all():
        return {
            max_steps: while_loop(
                lambda c: True,
                lambda c: c + 1,
                0,
                kind="bounded",
                max_steps=max_steps,
                base=base,
            )  # fmt: skip
            for max_steps in _MAX_STEPS
        }

    return jax.jit(run_all)()


@pytest.mark.parametrize("base", [2, 3, 16])
@pytest.mark.parametrize("max_steps", _MAX_STEPS)
def test_bounded_runs_exactly_max_steps(base, max_steps):
    # `cond` never stops the loop: only the bound does, whether or not
    # `max_steps` is a power of `base`.
    assert _steps_run(base)[max_steps] == max_steps


def _bounded(x, n):
    def body(c):
        return c[0] + 1, c[1] * jnp.cos(c[1]) + x

    return while_loop(
        lambda c: c[0] < n, body, (0, x), kind="bounded", max_steps=16, base=4
    )[1]


# One program each for every `n` (an argument: the loop's stopping point is data).
_bounded_value = jax.jit(_bounded)
_bounded_grad = jax.jit(jax.grad(_bounded))
_bounded_tangent = jax.jit(
    lambda x, n: jax.jvp(lambda v: _bounded(v, n), (x,), (1.0,))[1]
)


@pytest.mark.parametrize("n", [0, 1, 4, 5, 12])
def test_bounded_value_and_gradient_stop_where_cond_does(n):
    def unrolled(x):
        y = x
        for _ in range(n):
            y = y * jnp.cos(y) + x
        return y

    assert jnp.allclose(_bounded_value(0.4, n), unrolled(0.4))
    want = jax.grad(unrolled)(0.4)
    assert jnp.allclose(_bounded_grad(0.4, n), want, rtol=1e-5)
    assert jnp.allclose(_bounded_tangent(0.4, n), want, rtol=1e-5)


def test_bounded_gradient_does_not_store_every_state():
    # 1000 steps of a 16384-float carry: storing every state for the backward
    # pass would take 64 MB; the nested blocks are recomputed instead.
    size, steps = 16384, 1000

    def loss(w):
        def body(c):
            return c[0] + 1, jnp.sin(c[1] * w)

        init = (0, jnp.ones(size))
        out = while_loop(
            lambda c: c[0] < steps, body, init, kind="bounded", max_steps=steps,
            base=10,
        )  # fmt: skip
        return out[1].sum()

    compiled = jax.jit(jax.grad(loss)).lower(jnp.ones(size)).compile()
    memory = compiled.memory_analysis()
    if memory is None:
        pytest.skip("this backend reports no memory analysis")
    all_states = steps * size * 4  # 65.5 MB
    # 3.9 MB of temporaries on the CPU, 9.3 MB on a TPU v5e
    assert memory.temp_size_in_bytes < all_states / 5


def test_scan_length_from_length_alone():
    def step(c, _):
        return c + 1.0, c

    for kind in ("lax", "checkpointed"):
        carry, ys = scan(step, jnp.asarray(0.0), None, length=5, kind=kind)
        assert carry == 5.0 and ys.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_scan_length_errors():
    def step(c, x):
        return c, x

    with pytest.raises(ValueError, match="give `length=` when `xs` holds no arrays"):
        scan(step, 0.0, None, kind="checkpointed")
    with pytest.raises(ValueError, match=r"`xs\['b'\]` is a scalar"):
        scan(step, 0.0, {"a": jnp.ones(3), "b": jnp.asarray(1.0)}, kind="checkpointed")
    with pytest.raises(
        ValueError, match=r"different lengths \[3, 4\] \(3 for xs\[0\], 4 for xs\[1\]\)"
    ):
        scan(step, 0.0, (jnp.ones(3), jnp.ones(4)), kind="checkpointed")
    with pytest.raises(ValueError, match=r"4 for `length`, 3 for xs\[0\]"):
        scan(step, 0.0, (jnp.ones(3),), length=4, kind="checkpointed")
