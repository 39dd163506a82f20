"""Modules changed after construction through their `__dict__`, or through a
`__setattr__` of their own, are seen by `filter_jit`; `vars()` of a module
returned by a jitted call shows its fields. Both call paths."""

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw

pytestmark = pytest.mark.usefixtures("call_path")


class M(bw.Module):
    w: jax.Array


class Outer(bw.Module):
    inner: M


def _total(m):
    return m.w.sum()


def test_a_write_to_dict_is_seen():
    f = bw.filter_jit(_total)
    m = M(jnp.zeros(2))
    seen = []
    for i in range(4):
        seen.append(float(f(m)))
        m.__dict__["w"] = jnp.full(2, 2.5 * (i + 1))
    assert seen == [0.0, 5.0, 10.0, 15.0]


def test_a_write_to_a_nested_module_is_seen_through_the_outer_one():
    f = bw.filter_jit(lambda o: o.inner.w.sum())
    o = Outer(M(jnp.zeros(2)))
    seen = []
    for i in range(4):
        seen.append(float(f(o)))
        vars(o.inner)["w"] = jnp.full(2, 2.5 * (i + 1))
    assert seen == [0.0, 5.0, 10.0, 15.0]


def test_a_module_with_its_own_setattr_is_reread_every_call():
    class Mutable(bw.Module):
        w: jax.Array

        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)

    f = bw.filter_jit(_total)
    m = Mutable(jnp.zeros(2))
    seen = []
    for i in range(4):
        seen.append(float(f(m)))
        m.w = jnp.full(2, 2.5 * (i + 1))
    assert seen == [0.0, 5.0, 10.0, 15.0]
    nested = bw.filter_jit(lambda t: t[0].w.sum())
    assert float(nested((m,))) == 20.0
    m.w = jnp.ones(2)
    assert float(nested((m,))) == 2.0


def test_vars_of_a_jitted_output_shows_its_fields():
    out = bw.filter_jit(lambda m: jax.tree.map(lambda v: v + 1, m))(
        Outer(M(jnp.zeros(2)))
    )
    fields = vars(out)
    assert "inner" in fields and not any(k == "_boxwood_flat" for k in fields)
    assert float(fields["inner"].w[0]) == 1.0
    assert out.__dict__ is fields


def test_mutating_a_jitted_output_through_its_dict_is_seen():
    step = bw.filter_jit(lambda m: jax.tree.map(lambda v: v + 1, m))
    f = bw.filter_jit(_total)
    out = step(M(jnp.zeros(2)))
    assert float(f(out)) == 2.0
    assert float(f(out)) == 2.0
    out.__dict__["w"] = jnp.full(2, 5.0)
    assert float(f(out)) == 10.0
    assert float(f(step(out))) == 12.0
