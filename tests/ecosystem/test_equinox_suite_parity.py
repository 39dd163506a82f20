"""Differential tests: behaviours Equinox's own test suite relies on, compared with
Equinox where it is installed alongside."""

import warnings

import jax.numpy as jnp
import pytest

import boxwood as bw


def test_donate_warn_gives_one_warning_in_jaxs_words():
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


def test_filter_jvp_under_jax_jit_and_bad_tangents_are_type_errors():
    import equinox as eqx
    import jax

    f = lambda x, n: (x**2 * n, n)
    primals, tangents = (jnp.array(3.0), 2), (jnp.array(1.0), None)
    # jax 0.10 tracers have `__jax_array__ = None`: still arrays to filter_jvp
    ours = jax.jit(lambda p, t: bw.filter_jvp(f, (p, 2), (t, None)))(*primals[:1], 1.0)
    theirs = eqx.filter_jvp(f, primals, tangents)
    assert jnp.allclose(ours[0][0], theirs[0][0]) and ours[0][1] == 2
    assert jnp.allclose(ours[1][0], theirs[1][0]) and ours[1][1] is None
    for bad in ((None, jnp.array(1.0)), (None, object())):
        with pytest.raises(TypeError, match="must be `None`|structure of `primals`"):
            bw.filter_jvp(f, primals, bad)
        with pytest.raises(TypeError):
            eqx.filter_jvp(f, primals, bad)
    assert bw.is_array_like(jnp.ones(2)) and not bw.is_array_like(object())


def test_closure_convert_has_equinoxs_structs():
    import equinox as eqx
    import jax

    def run(z):
        fn = lambda y, args: ((y * z, {"n": args[1]}), y.sum())
        example = (jnp.ones(3), (jnp.zeros(2), "k"))
        ours = bw.filter_closure_convert(fn, *example)
        theirs = eqx.filter_closure_convert(fn, *example)
        assert ours.out_struct == theirs.out_struct
        assert ours.in_struct == theirs.in_struct
        return ours(*example)[0][0], ours.consts

    out, consts = jax.jit(run)(jnp.full(3, 2.0))
    assert jnp.array_equal(out, jnp.full(3, 2.0)) and len(consts) == 1
    for example in (1, jnp.ones(2)):
        plain = bw.filter_closure_convert(_add_one, example)
        theirs = eqx.filter_closure_convert(_add_one, example)
        assert type(plain).__name__ == type(theirs).__name__
        assert plain.out_struct == theirs.out_struct
        assert plain.in_struct == theirs.in_struct
    assert jnp.array_equal(plain(jnp.zeros(2)), jnp.ones(2))


def _add_one(a):
    return a + 1


def _custom_call(lib):
    @lib.filter_custom_jvp
    def call(x, y, *, fn):
        return fn(x, y)

    @call.def_jvp
    def call_jvp(primals, tangents, *, fn):
        (x, y), (tx, ty) = primals, tangents
        return call(x, y, fn=fn), tx**2 + (0.0 if ty is None else ty)

    return call


def test_custom_jvp_keeps_python_numbers_as_jax_and_equinox_do():
    import equinox as eqx
    import jax

    f = lambda a, b: a**2 + b
    for x, tx in ((2.0, 3.0), (jnp.array(2.0), jnp.array(3.0))):
        calls = [_custom_call(lib) for lib in (bw, eqx)]
        ours, theirs = [
            jax.jvp(lambda v, c=c: c(v, 1.0, fn=f), (x,), (tx,)) for c in calls
        ]
        assert type(ours[0]) is type(theirs[0]) and ours == theirs
    assert _custom_call(bw)(1, 2, fn=f) == 3  # integers are never differentiated


def test_custom_vjp_old_defvjp_and_nondifferentiable_arguments():
    import jax

    @bw.filter_custom_vjp
    def f(x, y):
        return x * y

    with pytest.warns(DeprecationWarning, match="def_fwd"):
        f.defvjp(lambda x, y: (x * y, y), lambda y, g, x, _: g * y + 1)
    assert jax.grad(lambda x: f(x, 3.0))(2.0) == 4.0
    with pytest.raises(RuntimeError, match=r"with respect to `args\[0\]`"):
        jax.grad(lambda x: f(x, x))(1.0)
    with pytest.raises(TypeError, match="Functions wrapped with `filter_grad`"):
        bw.filter_grad(lambda x: x + 1)(x=jnp.array(1.0))


def test_tree_equal_result_types_follow_equinox():
    import equinox as eqx
    import jax
    import numpy as np

    x, y = np.ones(2, np.float32), jnp.ones(2)
    cases = [
        ((x, x), {}),
        ((x, y), {}),
        ((x, y), {"typematch": True}),
        ((y, y), {}),
        (([1, {"a": y}], [1, {"a": y + 1}]), {}),
        ((1, 2), {}),
        ((y, 0), {}),
        ((jnp.arange(3), jnp.arange(3)), {"rtol": 1e-3}),
    ]
    for trees, kwargs in cases:
        ours, theirs = bw.tree_equal(*trees, **kwargs), eqx.tree_equal(*trees, **kwargs)
        assert type(ours) is type(theirs) and bool(ours) == bool(theirs), trees

    def under_jit(a):
        assert bw.tree_equal(a, 0) is False  # known without the values
        return bw.tree_equal(a, y)

    assert bool(jax.jit(under_jit)(y))


def test_tree_at_on_shared_empty_tuples_and_replace_errors():
    import equinox as eqx

    a = ()
    for tree in ([a, a], [(), ()], [(1,), (1,)]):
        for lib in (bw, eqx):
            assert lib.tree_at(lambda t: t[0], tree, "x") == ["x", tree[1]]
            assert lib.tree_at(lambda t: t[0], tree, replace_fn=len)[0] == len(tree[0])
    where = lambda t: (t[0], t[1])
    with pytest.raises(TypeError, match="must be a sequence of 2 values; got int"):
        bw.tree_at(where, [1, 2], replace=4)
    with pytest.raises(ValueError, match="must be a sequence of 2 values"):
        bw.tree_at(where, [1, 2], replace=(1, 2, 3))


def _wrapped_target(a, b=1):
    return a


def test_tree_pformat_of_weak_arrays_and_functions_matches_equinox():
    import functools

    import equinox as eqx
    import jax
    import numpy as np

    @functools.wraps(_wrapped_target)
    def wrapper():
        pass

    cases = [
        jnp.array(1),
        jnp.array(1.0),
        jnp.ones((2, 3)),
        np.ones(2),
        wrapper,
        _wrapped_target,
        functools.partial(_wrapped_target),
        functools.partial(_wrapped_target, jnp.ones(2), b=3),
    ]
    for x in cases:
        assert bw.tree_pformat(x) == eqx.tree_pformat(x), x
    struct = jax.ShapeDtypeStruct((2,), jnp.float32, weak_type=True)
    assert bw.tree_pformat(struct, struct_as_array=True) == "weak_f32[2]"


def test_filter_vmap_broadcasts_an_output_number_given_an_axis():
    import equinox as eqx

    for lib in (bw, eqx):
        out = lib.filter_vmap(lambda x: x, out_axes=0, axis_size=3)(1)
        assert jnp.array_equal(out, jnp.ones(3, jnp.int32))
    with pytest.raises(ValueError, match="it is str 'a', not an array"):
        bw.filter_vmap(lambda x: "a", out_axes=0, axis_size=3)(1)


def test_equinox_file_errors_are_runtime_errors_naming_the_key_path(tmp_path):
    import equinox as eqx

    path = tmp_path / "m.eqx"
    eqx.tree_serialise_leaves(path, (jnp.array(1), {"a": jnp.array(1)}))
    bad = (jnp.array(2), {"a": jnp.array(2.0)})  # float32 where the file has int32
    for lib in (bw, eqx):
        with pytest.raises(RuntimeError, match=r"Deserialised leaf at path \(Seq"):
            lib.tree_deserialise_leaves(path, bad)
    with pytest.raises(
        bw.CheckpointError,
        match=r"`1.a`: the file's next array \(record 1\) is i32\[\]",
    ):
        bw.tree_deserialise_leaves(path, bad)
    eqx.tree_serialise_leaves(path, (jnp.array(1), {}))
    more = (jnp.array(2), {"a": jnp.array(2)})
    with pytest.raises(RuntimeError, match=r"Error at leaf with path \(SequenceKey"):
        bw.tree_deserialise_leaves(path, more)


def _backward_nan_output(lib, capfd):
    import jax

    f = lambda x: lib.debug.backward_nan(x, name="foo", terminate=False) * 2
    capfd.readouterr()
    jax.grad(f)(jnp.array(1.0))
    jax.effects_barrier()
    return capfd.readouterr().out


def test_backward_nan_prints_values_as_equinox_does(capfd):
    import equinox as eqx

    ours = _backward_nan_output(bw, capfd)
    assert ours == _backward_nan_output(eqx, capfd)
    assert ours.startswith("foo:\n   primals=Array(1., dtype=float32")


def test_closure_to_pytree_makes_local_functions_equal_without_retracing():
    import optax

    from boxwood import internal as bwi

    def make(lr):
        def init_fn(params):  # no free variables, a new object per call
            return params

        a = jnp.array(lr)
        return bwi.closure_to_pytree((optax.adam(a), init_fn, lambda x: x * a))

    traces = []
    f = bw.filter_jit(lambda t: traces.append(1))
    f(make(1e-3))
    f(make(1e-2))
    assert len(traces) == 1  # only the arrays differ
    assert make(1.0)[1](3) == 3 and make(2.0)[2](3.0) == 6.0


def test_omega_operands_need_the_same_is_leaf():
    from boxwood.internal import ω

    tree = [1, jnp.ones(2)]
    with pytest.raises(ValueError, match="needs the same `is_leaf` on both sides"):
        ω(tree) + ω(tree, is_leaf=lambda x: isinstance(x, int))
    with pytest.raises(ValueError, match=r"\.at\[\]\.set ω` needs the same `is_leaf`"):
        ω(tree, is_leaf=lambda x: isinstance(x, int)).at[()].set(ω(tree))
    out = ω(tree, is_leaf=lambda x: isinstance(x, int)) + ω(
        tree, is_leaf=lambda x: isinstance(x, int)
    )  # two lambdas of the same code
    assert out.ω[0] == 2
