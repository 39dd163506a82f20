"""boxwood's frames are left out of the source locations JAX records (as JAX's
own are): a lowered program's metadata names the user's lines only."""

import os

import jax
import jax.numpy as jnp

import boxwood as bw

BOXWOOD = os.path.dirname(os.path.abspath(bw.__file__))


def _user_function(x):
    return jnp.sin(x) * 2.0


def test_lowered_locations_name_the_users_lines_not_boxwoods():
    layer = bw.nn.Linear(3, 3, key=jax.random.key(0))

    @bw.filter_jit
    def f(model, x):
        return _user_function(model(x))

    text = f.lower(layer, jnp.ones(3)).as_text(debug_info=True)
    assert __file__ in text  # the user's file is named
    assert BOXWOOD not in text  # none of boxwood's own


def test_a_checkpointed_loop_records_only_the_users_frames():
    from boxwood.internal import while_loop

    def loss(x):
        out = while_loop(
            lambda c: c[0] < 5, lambda c: (c[0] + 1, _user_function(c[1]) * x),
            (0, jnp.ones(2)), kind="checkpointed", max_steps=8,
        )  # fmt: skip
        return out[1].sum()

    text = jax.jit(jax.grad(loss)).lower(0.5).as_text(debug_info=True)
    assert __file__ in text
    assert BOXWOOD not in text
