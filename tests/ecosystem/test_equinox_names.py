"""Small Equinox names: static_field, strict=/is_abstract=, module_update_wrapper,
clear_caches, tree_pformat options, filter_vmap / filter_pure_callback options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw


def test_static_field_is_deprecated_but_works():
    with pytest.warns(DeprecationWarning, match=r"field\(static=True"):

        class M(bw.Module):
            n: int = bw.static_field(default=3)

    assert jax.tree_util.tree_leaves(M()) == []


def test_strict_and_is_abstract_class_keywords():
    class Strict(bw.Module, strict=True):
        x: int = 1

    assert Strict().x == 1

    class Base(bw.Module, is_abstract=True):
        x: int = 1

    class Concrete(Base):
        pass

    assert Concrete().x == 1
    with pytest.raises(TypeError, match="`Base` was declared with `is_abstract=True`"):
        Base()

    class Legacy(bw.Module, strict=None):  # Equinox's StrictConfig(force_abstract)
        pass

    with pytest.raises(TypeError, match="is_abstract=True"):
        Legacy()


def test_module_update_wrapper():
    class Wrapper(bw.Module):
        fn: object

        def __call__(self, *args):
            return self.fn(*args)

        @property
        def __wrapped__(self):
            return self.fn

    def double(x):
        """Twice."""
        return 2 * x

    original = Wrapper(double)
    w = bw.module_update_wrapper(original)
    assert (w.__name__, w.__doc__, w(2)) == ("double", "Twice.", 4)
    assert "__name__" not in original.__dict__  # the input is not modified

    class NoWrapped(bw.Module):
        fn: object

    with pytest.raises(ValueError, match="`__wrapped__` as a property"):
        bw.module_update_wrapper(NoWrapped(double))


def test_clear_caches_empties_filter_jit():
    f = bw.filter_jit(lambda x: x + 1)
    f(jnp.ones(2))
    assert f.cache_info().size >= 1
    bw.clear_caches()
    assert f.cache_info().size == 0


def test_tree_pformat_options():
    struct = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert bw.tree_pformat({"a": struct}, struct_as_array=True) == "{'a': f32[2,3]}"
    assert "ShapeDtypeStruct" in bw.tree_pformat({"a": struct})
    text = bw.tree_pformat([[1, 2], (3,)], truncate_leaf=lambda n: isinstance(n, list))
    assert text == "list(...)"
    text = bw.tree_pformat([[1, 2], (3,)], truncate_leaf=lambda n: n == [1, 2])
    assert text == "[list(...), (3,)]"


def test_pprint_passes_options(capsys):
    bw.tree_pprint([jax.ShapeDtypeStruct((1,), jnp.int32)], struct_as_array=True)
    assert capsys.readouterr().out == "[i32[1]]\n"


def test_filter_vmap_passes_vmapkwargs():
    out = bw.filter_vmap(lambda x: x * 2, spmd_axis_name=None)(jnp.ones(3))
    assert out.tolist() == [2.0] * 3
    decorated = bw.filter_vmap(spmd_axis_name=None)(lambda x: x + 1)
    assert decorated(jnp.zeros(2)).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="bogus"):  # reached jax.vmap
        bw.filter_vmap(lambda x: x, bogus=1)(jnp.ones(2))
    with pytest.raises(TypeError, match="must be hashable"):
        bw.filter_vmap(lambda x: x, spmd_axis_name=["a"])


def test_filter_pure_callback_vectorized_is_deprecated():
    def host(x):
        return np.asarray(x) * 2

    struct = jax.ShapeDtypeStruct((2,), jnp.float32)
    with pytest.warns(DeprecationWarning, match="vmap_method='legacy_vectorized'"):
        out = bw.filter_pure_callback(
            host, jnp.ones(2), result_shape_dtypes=struct, vectorized=True
        )
    assert out.tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="not both"):
        bw.filter_pure_callback(
            host,
            jnp.ones(2),
            result_shape_dtypes=struct,
            vectorized=True,
            vmap_method="sequential",
        )
