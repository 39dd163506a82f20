import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw
from _child_flags import child_env, xla_flags_with_devices


def test_filter_pmap_single_device_static_and_cache():
    n = jax.local_device_count()
    traces = 0

    def f(x, k, name):
        nonlocal traces
        traces += 1
        return {"y": x * k, "name": name}

    g = bw.filter_pmap(f)
    out = g(jnp.ones((n, 3)), 2.0, "tag")
    assert out["name"] == "tag" and out["y"].shape == (n, 3)
    assert float(out["y"][0, 0]) == 2.0
    # two traces per program, as in Equinox: an abstract one that finds the
    # output's structure and axes, then jax.pmap's
    assert traces == 2
    g(jnp.ones((n, 3)), 2.0, "tag")
    bw.filter_pmap(f)(jnp.ones((n, 3)), 2.0, "tag")  # another wrapper of f: shared
    assert traces == 2
    g(jnp.ones((n, 3)), 3.0, "tag")  # a new static value compiles again
    assert traces == 4
    # an unmapped array is broadcast to every device; pmap options reach jax.pmap
    h = bw.filter_pmap(lambda x, w: x * w, in_axes=(0, None), devices=jax.devices())
    assert h(jnp.ones((n, 2)), jnp.array([2.0, 3.0]))[0].tolist() == [2.0, 3.0]
    donated = bw.filter_pmap(lambda x: x + 1, donate="all")(jnp.ones((n, 2)))
    assert donated.shape == (n, 2)


def test_filter_pmap_errors():
    with pytest.raises(ValueError, match="'none', 'all' or 'warn'"):
        bw.filter_pmap(lambda x: x, donate="some")
    with pytest.raises(TypeError, match="positional arguments only"):
        bw.filter_pmap(lambda x: x)(x=jnp.ones((1,)))
    with pytest.raises(ValueError, match="no argument is mapped.*axis_size="):
        bw.filter_pmap(lambda x: x, in_axes=None)(jnp.ones(2))


def test_filter_pmap_unmapped_outputs_keyword_axes_and_aot():
    n = jax.local_device_count()
    # an output given None comes from the first device; a number given 0 is
    # broadcast; nothing mapped needs axis_size
    f = bw.filter_pmap(lambda x: (x, 1), in_axes=None, out_axes=(None, 0), axis_size=n)
    out, one = f(jnp.array([3, 4]))
    assert out.tolist() == [3, 4] and one.tolist() == [1] * n
    g = bw.filter_pmap(lambda x, y: x + y, in_axes=dict(y=1))
    x, y = jnp.ones((n, 4)), jnp.arange(n * 1.0).reshape(1, n)
    assert jnp.array_equal(g(x, y), x + y.T)
    with pytest.raises(ValueError, match=r"`in_axes` names \['z'\]"):
        bw.filter_pmap(lambda x: x, in_axes=dict(z=0))(x)
    compiled = bw.filter_pmap(lambda x, k: x * k).lower(x, 2).compile()
    assert jnp.array_equal(compiled(x, 2), 2 * x)
    with pytest.raises(TypeError, match="lowered for other arguments"):
        compiled(x, 3)


def test_filter_pmap_eight_devices():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, boxwood as bw
        assert jax.local_device_count() == 8
        f = bw.filter_pmap(lambda x, k: jax.lax.psum(x * k, "i"), axis_name="i")
        out = f(jnp.arange(8.0), 2)
        assert out.tolist() == [56.0] * 8, out
        g = bw.filter_pmap(lambda x: x * 2, out_axes=1)
        assert g(jnp.ones((8, 2))).shape == (2, 8)
        print("ok")
        """
    )
    env = child_env(XLA_FLAGS=xla_flags_with_devices(8))
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
