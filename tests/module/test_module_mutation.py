"""Modules changed after construction through their `__dict__`, or through a
`__setattr__` of their own, are seen by `filter_jit`; `vars()` of a module
returned by a jitted call shows its fields. Both call paths."""

import copy
import json
import pickle

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


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
    assert list(fields) == ["inner"]  # no `_boxwood_flat` or `_boxwood_rebuild`
    assert float(fields["inner"].w[0]) == 1.0
    assert out.__dict__ == fields


def test_mutating_a_jitted_output_through_its_dict_is_seen():
    step = bw.filter_jit(lambda m: jax.tree.map(lambda v: v + 1, m))
    f = bw.filter_jit(_total)
    out = step(M(jnp.zeros(2)))
    assert float(f(out)) == 2.0
    assert float(f(out)) == 2.0
    out.__dict__["w"] = jnp.full(2, 5.0)
    assert float(f(out)) == 10.0
    assert float(f(step(out))) == 12.0


class Scaled(bw.Module):
    w: jax.Array
    scale: float = bw.field(static=True, default=2.0)


def test_vars_lists_exactly_the_fields_as_for_any_object():
    m = Scaled(jnp.ones(2))
    assert list(vars(m)) == ["w", "scale"]
    assert list(m.__dict__) == ["w", "scale"]
    assert isinstance(vars(m), dict)
    assert json.dumps(sorted(vars(m))) == '["scale", "w"]'
    assert pickle.loads(pickle.dumps(vars(m)))["scale"] == 2.0
    assert type(copy.copy(vars(m))) is dict and type(vars(m).copy()) is dict
    assert Scaled(**vars(m)).scale == 2.0


def test_reading_vars_forgets_nothing(count_flattens):
    f = bw.filter_jit(_total)
    m = M(jnp.ones(2))
    f(m), f(m)
    before = count_flattens["n"]
    for _ in range(3):
        assert list(vars(m)) == ["w"]
        assert float(f(m)) == 2.0
    assert count_flattens["n"] == before  # every call stayed on the fast path


def test_every_dict_method_writes_to_the_module():
    f = bw.filter_jit(lambda m: m.w.sum() * m.scale)
    m = Scaled(jnp.ones(2))
    assert float(f(m)) == 4.0
    vars(m).update(w=jnp.full(2, 3.0))
    assert float(f(m)) == 12.0
    vars(m)["scale"] = 10.0  # a static field: the compiled code follows it
    assert float(f(m)) == 60.0
    vars(m).setdefault("scale", 99.0)  # present: unchanged
    assert float(f(m)) == 60.0
    fields = vars(m)
    fields |= {"w": jnp.zeros(2)}
    assert float(f(m)) == 0.0
    assert vars(m).pop("w") is not None
    with pytest.raises(AttributeError, match="no attribute 'w'"):
        _ = m.w
    vars(m)["w"] = jnp.ones(2)
    del vars(m)["scale"]
    assert Scaled.scale == 2.0 and "scale" not in vars(m)
    with pytest.raises(KeyError, match="scale"):
        del vars(m)["scale"]
    vars(m).clear()
    assert vars(m) == {}


def test_boxwood_entries_cannot_be_written_through_vars():
    m = Scaled(jnp.ones(2))
    with pytest.raises(ValueError, match="`_boxwood_rebuild` is boxwood's own entry"):
        vars(m)["_boxwood_rebuild"] = None
    with pytest.raises(ValueError, match="`_boxwood_flat` is boxwood's own entry"):
        vars(m).update(_boxwood_flat=None)


def test_writes_through_dict_during_init():
    class Direct(bw.Module):
        a: int
        b: jax.Array

        def __init__(self):
            self.__dict__["a"] = 1
            vars(self).update(b=jnp.zeros(2))

    d = Direct()
    assert d.a == 1 and list(vars(d)) == ["a", "b"]
    assert jax.tree.leaves(d)[1].shape == (2,)


def test_replacing_the_whole_dict_is_seen():
    f = bw.filter_jit(lambda m: m.w.sum() * m.scale)
    m = Scaled(jnp.ones(2))
    assert float(f(m)) == 4.0
    object.__setattr__(m, "__dict__", {"w": jnp.ones(2), "scale": 7.0})
    assert float(f(m)) == 14.0
    assert vars(m) == {"w": m.w, "scale": 7.0}
