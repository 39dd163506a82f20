"""A captured value without arrays (a `filter_grad` wrapper, an `nn.Lambda`) is an
input like any module: passed to the compiled code as itself, it carries a flat form
whose token stands for its non-array leaves (`_module/_flat_key.py`), so warm calls walk
it in one step and never flatten, and rebinding it to an unequal value recompiles
with the changed field named."""

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import boxwood as bw
from _precision import tolerance
from boxwood import nn


@jax.numpy_dtype_promotion("standard")  # optax's adam mixes int32 and float
def test_a_training_step_reading_a_grad_wrapper_stays_on_the_fast_path(request):
    tx = optax.adam(1e-2)
    grad_fn = bw.filter_value_and_grad(lambda m, x: jnp.sum(m(x) ** 2))

    @bw.filter_jit
    def step(model, opt_state, x):
        loss, grads = grad_fn(model, x)  # a module without arrays, from the closure
        updates, opt_state = tx.update(grads, opt_state, model)
        return bw.apply_updates(model, updates), opt_state, loss

    model = nn.Linear(3, 2, key=jax.random.key(0))
    opt_state = tx.init(bw.filter(model, bw.is_inexact_array))
    x = jnp.ones(3)
    for _ in range(3):  # cold, then remembered
        model, opt_state, loss = step(model, opt_state, x)
    flattens = request.getfixturevalue("count_flattens")  # from here on
    losses = []
    for _ in range(5):
        model, opt_state, loss = step(model, opt_state, x)
        losses.append(float(loss))
    assert flattens["n"] == 0  # every warm call found its compiled code by the walk
    assert losses == sorted(losses, reverse=True)  # it trains
    assert step.cache_info().traces == 1


def test_rebinding_a_module_without_arrays_recompiles_and_says_what_changed():
    global act
    act = nn.Lambda(jnp.tanh)

    @bw.filter_jit(explain=True)
    def f(x):
        return act(x)

    near = tolerance(cpu=1e-6, accelerator=1e-5)  # a TPU's tanh: a few ulps off
    assert f(jnp.ones(2)).tolist() == pytest.approx([0.7615942] * 2, rel=near)
    act = nn.Lambda(jnp.tanh)  # another object, equal: no recompile
    f(jnp.ones(2))
    assert f.cache_info().traces == 1
    act = nn.Lambda(jax.nn.relu)
    with pytest.warns(
        bw.RecompileWarning,
        match=r"global 'act'\.fn\.fn: <PjitFunction of <function tanh.* -> "
        r"<jax\._src\.custom_derivatives\.custom_jvp",
    ):
        assert f(-jnp.ones(2)).tolist() == [0.0, 0.0]
    assert f.cache_info().traces == 2
    act = nn.Lambda(jnp.tanh)  # back to the first: its compiled code again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        near = tolerance(cpu=1e-6, accelerator=1e-5)  # a TPU's tanh: a few ulps off
    assert f(jnp.ones(2)).tolist() == pytest.approx([0.7615942] * 2, rel=near)
    assert f.cache_info().traces == 2
