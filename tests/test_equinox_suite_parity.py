"""Differential tests: behaviours Equinox's own test suite relies on, compared with
Equinox where it is installed alongside."""

import warnings

import jax.numpy as jnp

import boxwood as bw


def test_donate_warn_gives_one_warning_in_jaxs_words(call_path):
    g = bw.filter_jit(lambda x, y: x + jnp.sum(y), donate="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g(jnp.array(1.0), jnp.ones((10,)))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages  # JAX's own warning is not repeated
    assert messages[0].startswith("Some donated buffers were not usable")
    assert "args[1] f32[10]" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bw.filter_jit(lambda x, y: x + jnp.sum(y))(jnp.array(1.0), jnp.ones((10,)))
