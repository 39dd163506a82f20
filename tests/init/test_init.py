"""Fast initialisation (`boxwood._init`): bit-identical to the direct `jax.random`
draws, one kernel per (distribution, dtype), the fallbacks, and `nn.init`."""

import functools

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

import boxwood
import boxwood.nn as nn
from _precision import assert_same_draws, tolerance
from boxwood import _init
from boxwood._init import _draw, _keys

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
SHAPES = [
    (),
    (0,),
    (1,),
    (7,),
    (37, 53),
    (3, 4, 5),
    (_draw.CHUNK + 1,),
    (2, _draw.CHUNK),
]
KEYS = [lambda: jr.key(0), lambda: jr.key(2**31 + 5), lambda: jr.PRNGKey(123)]


def _bits(x):
    x = np.asarray(x)
    return x.dtype, x.shape, x.tobytes()


def _direct(dist, key, shape, dtype, bounds=None):
    if dist == "uniform":
        return jr.uniform(key, shape, dtype, *(bounds or (-0.25, 0.5)))
    if dist == "normal":
        return jr.normal(key, shape, dtype)
    return jr.truncated_normal(key, *(bounds or (-1.5, 2.0)), shape, dtype)


def _fast(dist, key, shape, dtype):
    if dist == "uniform":
        return _init.uniform(key, shape, dtype, -0.25, 0.5)
    if dist == "normal":
        return _init.normal(key, shape, dtype)
    return _init.truncated_normal(key, -1.5, 2.0, shape, dtype)


@functools.cache
def _direct_draws(dist, dtype):
    """The direct draws of `test_draws_bit_identical` for every key kind (each
    with its third of the shapes), by shape: `jax.random`'s functions traced into
    one program per (distribution, dtype) rather than compiled once per shape.
    The bounds are arguments of that program, as of `jax.random`'s own (closed
    over, XLA would fold the truncated normal's `erf` of them into constants a
    float32 ulp away from what the draw computes)."""
    cases = [(k, shape) for k in range(len(KEYS)) for shape in SHAPES[k :: len(KEYS)]]
    bounds = (-0.25, 0.5) if dist == "uniform" else (-1.5, 2.0)
    draws = jax.jit(
        lambda keys, bounds: [
            _direct(dist, keys[k], shape, dtype, bounds) for k, shape in cases
        ]
    )([make() for make in KEYS], bounds)
    return dict(zip(cases, draws, strict=True))


@pytest.mark.parametrize("dist", ["uniform", "normal", "truncated_normal"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(len(KEYS)))
def test_draws_bit_identical(dist, dtype, k):
    # Every shape with every (distribution, dtype), a third of them per key kind.
    key = KEYS[k]()
    for shape in SHAPES[k :: len(KEYS)]:
        fast = _fast(dist, key, shape, dtype)
        assert_same_draws(fast, _direct_draws(dist, dtype)[k, shape], dist)


@pytest.mark.skipif(
    jax.default_backend() == "tpu", reason="a TPU has no float64 (it does not compile)"
)
def test_float64_bit_identical():
    with jax.enable_x64(True):
        key = jr.key(3)
        cases = [(d, s) for d in ["uniform", "normal", "truncated_normal"]
                 for s in [(5,), (37, 53)]]  # fmt: skip
        # the direct draws in one program (bounds as its arguments, as in
        # `_direct_draws`), not one compile per case
        direct = jax.jit(
            lambda key, u, t: [
                _direct(d, key, s, jnp.float64, u if d == "uniform" else t)
                for d, s in cases
            ]
        )(key, (-0.25, 0.5), (-1.5, 2.0))
        for (dist, shape), want in zip(cases, direct, strict=True):
            fast = _fast(dist, key, shape, jnp.float64)
            assert fast.dtype == jnp.float64
            assert _bits(fast) == _bits(want)


def test_one_kernel_per_distribution_and_dtype(monkeypatch):
    # (All on the host-bits path: the process-wide count starts afresh.)
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    _draw._kernel.cache_clear()
    key = jr.key(0)
    for shape in [(3,), (64, 256), (10, 7, 2), (_draw.CHUNK * 3,)]:
        _init.uniform(key, shape, jnp.float32, -1.0, 1.0)
    assert _draw._kernel.cache_info().currsize == 1
    _init.normal(key, (5,), jnp.float32)
    _init.uniform(key, (5,), jnp.bfloat16, -1.0, 1.0)
    assert _draw._kernel.cache_info().currsize == 3


def _record_kernels(monkeypatch):
    # The `host_bits` flag of every kernel a draw asks for.
    flags = []
    original = _draw._kernel
    monkeypatch.setattr(_draw, "_kernel", lambda *a: flags.append(a[2]) or original(*a))
    return flags


@pytest.mark.parametrize("dist", ["uniform", "normal", "truncated_normal"])
def test_device_bits_kernel_bit_identical(dist, monkeypatch):
    # Past HOST_BITS_LIMIT the kernel hashes the counters itself: same bits.
    monkeypatch.setattr(_draw, "HOST_BITS_LIMIT", 0)
    flags = _record_kernels(monkeypatch)
    key = jr.key(7)
    for shape, dtype in [((37, 53), jnp.float32), ((_draw.CHUNK + 1,), jnp.bfloat16)]:
        fast = _fast(dist, key, shape, dtype)
        assert _bits(fast) == _bits(_direct(dist, key, shape, dtype)), shape
    assert flags == [False, False]


def test_host_bits_until_the_limit_then_device_bits(monkeypatch):
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    monkeypatch.setattr(_draw, "HOST_BITS_LIMIT", 100)
    flags = _record_kernels(monkeypatch)
    key = jr.key(1)
    small = _init.uniform(key, (95,), jnp.float32, -1.0, 1.0)  # 95 <= 100: host
    big = _init.uniform(key, (6,), jnp.float32, -1.0, 1.0)  # 101 > 100: device
    assert flags == [True, False]
    assert _draw._host_hashed == 95
    for fast, shape in [(small, (95,)), (big, (6,))]:
        assert _bits(fast) == _bits(jr.uniform(key, shape, jnp.float32, -1.0, 1.0))


def test_counter_bits_match_threefry_across_the_high_word():
    data = np.array([0x12345678, 0x9ABCDEF0], np.uint32)
    offset = 2**32 - 3  # the low word wraps, the high word carries
    index = np.arange(offset, offset + 6, dtype=np.uint64)
    hi = jnp.asarray((index >> np.uint64(32)).astype(np.uint32))
    lo = jnp.asarray((index & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    want = threefry2x32_p.bind(jnp.uint32(data[0]), jnp.uint32(data[1]), hi, lo)
    got = _keys.counter_bits(data, offset, 6)
    for g, w in zip(got, want):
        assert _bits(g) == _bits(w)


def _count_chunk_calls(monkeypatch):
    calls = []
    original = _draw._draw_chunks
    monkeypatch.setattr(
        _draw, "_draw_chunks", lambda *a: calls.append(a) or original(*a)
    )
    return calls


def test_fallback_when_not_partitionable(monkeypatch):
    calls = _count_chunk_calls(monkeypatch)
    jax.config.update("jax_threefry_partitionable", False)
    try:
        key = jr.key(1)
        fast = _init.uniform(key, (37, 53), jnp.float32, -1.0, 1.0)
        direct = jr.uniform(key, (37, 53), jnp.float32, -1.0, 1.0)
        keys = _init.split_keys(key, 3)
        direct_keys = jr.split(key, 3)
    finally:
        jax.config.update("jax_threefry_partitionable", True)
    assert _bits(fast) == _bits(direct)
    assert _bits(jr.key_data(jnp.stack(keys))) == _bits(jr.key_data(direct_keys))
    assert calls == []


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_fallback_for_other_prng_impls(monkeypatch, impl):
    calls = _count_chunk_calls(monkeypatch)
    key = jr.key(1, impl=impl)
    fast = _init.normal(key, (4, 9), jnp.float32)
    assert _bits(fast) == _bits(jr.normal(key, (4, 9), jnp.float32))
    a, b = _init.split_keys(key)
    assert _bits(jr.key_data(a)) == _bits(jr.key_data(jr.split(key)[0]))
    assert calls == []


def test_fallback_under_jit_and_for_large_or_complex_draws(monkeypatch):
    calls = _count_chunk_calls(monkeypatch)
    key = jr.key(4)
    traced = jax.jit(lambda k: _init.uniform(k, (6,), jnp.float32, 0.0, 1.0))(key)
    assert _bits(traced) == _bits(jr.uniform(key, (6,), jnp.float32, 0.0, 1.0))
    closed = jax.jit(lambda: _init.normal(key, (6,), jnp.float32))()
    assert _bits(closed) == _bits(jr.normal(key, (6,), jnp.float32))
    raw = jr.PRNGKey(4)
    closed = jax.jit(lambda: _init.normal(raw, (6,), jnp.float32))()
    assert _bits(closed) == _bits(jr.normal(raw, (6,), jnp.float32))
    monkeypatch.setattr(_draw, "MAX_FAST_SIZE", 10)
    big = _init.uniform(key, (11,), jnp.float32, 0.0, 1.0)
    assert _bits(big) == _bits(jr.uniform(key, (11,), jnp.float32, 0.0, 1.0))
    cplx = _init.normal(key, (3,), jnp.complex64)
    assert _bits(cplx) == _bits(jr.normal(key, (3,), jnp.complex64))
    # Only the closed-over raw key under `jit` reached the kernel (and fell back).
    assert len(calls) == 1


def test_array_bounds_and_traced_bounds_fall_back(monkeypatch):
    # Bounds given per element broadcast against the whole shape; a chunk of the
    # draw cannot take them, so these are drawn directly, as `jax.random` does.
    calls = _count_chunk_calls(monkeypatch)
    key = jr.key(5)
    low = jnp.array([[-1.0, -2.0, -3.0]])
    fast = _init.truncated_normal(key, low, 1.0, (2, 3), jnp.float32)
    assert _bits(fast) == _bits(jr.truncated_normal(key, low, 1.0, (2, 3)))
    fast = _init.uniform(key, (3,), jnp.float32, np.array([0.0, 1.0, 2.0]), 3.0)
    direct = jr.uniform(key, (3,), jnp.float32, np.array([0.0, 1.0, 2.0]), 3.0)
    assert _bits(fast) == _bits(direct)
    assert calls == []

    # A traced bound (differentiating through `minval`) with a concrete key.
    def total(draw, minval):
        return draw(key, (4,), jnp.float32, minval, 1.0).sum()

    assert jax.grad(lambda m: total(_init.uniform, m))(0.25) == jax.grad(
        lambda m: total(jr.uniform, m)
    )(0.25)


@pytest.mark.parametrize("make_key", KEYS)
def test_split_keys_bit_identical(make_key):
    key = make_key()
    for num in [1, 2, 3, 4, 9, 100]:
        keys = _init.split_keys(key, num)
        assert len(keys) == num
        direct = jr.split(key, num)
        if jnp.issubdtype(direct.dtype, jax.dtypes.prng_key):
            assert all(k.dtype == direct.dtype for k in keys)
            keys, direct = [jr.key_data(k) for k in keys], jr.key_data(direct)
        # (stacked by NumPy: the same bytes, with no program compiled per `num`)
        assert _bits(np.stack([np.asarray(k) for k in keys])) == _bits(direct)


@pytest.mark.parametrize("num", [1, 2, 3, 8])
def test_small_threefry_matches_array_threefry(num, monkeypatch):
    # Up to `_SMALL` counters the hash runs on Python ints; the NumPy rounds agree.
    rng = np.random.default_rng(num)
    x0, x1 = (rng.integers(0, 2**32, (num,), dtype=np.uint32) for _ in range(2))
    small = _keys.threefry2x32(0x9E3779B9, 0xFFFFFFFF, x0, x1)
    monkeypatch.setattr(_keys, "_SMALL", 0)
    array = _keys.threefry2x32(0x9E3779B9, 0xFFFFFFFF, x0, x1)
    for a, b in zip(small, array):
        assert _bits(a) == _bits(b)


def test_split_keys_traced_key():
    out = jax.jit(lambda k: jnp.stack(_init.split_keys(k, 3)))(jr.PRNGKey(0))
    assert _bits(out) == _bits(jr.split(jr.PRNGKey(0), 3))


# ------------------------------------------------------------ layers: defaults
def _u(key, shape, bound):
    return jr.uniform(key, shape, jnp.float32, minval=-bound, maxval=bound)


def test_linear_default_weights_unchanged(getkey):
    key = getkey()
    layer = nn.Linear(7, 5, key=key)
    wkey, bkey = jr.split(key)
    assert _bits(layer.weight) == _bits(_u(wkey, (5, 7), 1 / np.sqrt(7)))
    assert _bits(layer.bias) == _bits(_u(bkey, (5,), 1 / np.sqrt(7)))


def test_conv_and_embedding_defaults_unchanged(getkey):
    key = getkey()
    conv = nn.Conv2d(4, 6, 3, groups=2, key=key)
    wkey, bkey = jr.split(key)
    bound = 1 / np.sqrt(2 * 9)
    assert _bits(conv.weight) == _bits(_u(wkey, (6, 2, 3, 3), bound))
    assert _bits(conv.bias) == _bits(_u(bkey, (6, 1, 1), bound))
    table = nn.Embedding(11, 3, key=key)
    assert _bits(table.weight) == _bits(jr.normal(key, (11, 3), jnp.float32))


def test_rnn_mlp_attention_defaults_unchanged(getkey):
    key = getkey()
    gru = nn.GRUCell(3, 4, key=key)
    ikey, hkey, bkey, nkey = jr.split(key, 4)
    assert _bits(gru.weight_hh) == _bits(_u(hkey, (12, 4), 0.5))
    assert _bits(gru.bias_n) == _bits(_u(nkey, (4,), 0.5))
    lstm = nn.LSTMCell(3, 4, key=key)
    assert _bits(lstm.bias) == _bits(_u(jr.split(key, 3)[2], (16,), 0.5))
    mlp = nn.MLP(3, 2, 8, 3, key=key)
    keys = jr.split(key, 4)
    assert _bits(mlp.layers[2].weight) == _bits(nn.Linear(8, 8, key=keys[2]).weight)
    wkey = jr.split(keys[2])[0]
    assert _bits(mlp.layers[2].weight) == _bits(_u(wkey, (8, 8), 1 / np.sqrt(8)))
    attn = nn.MultiheadAttention(2, 8, key=key)
    okey = jr.split(key, 4)[3]
    expected = _u(jr.split(okey)[0], (8, 8), 1 / np.sqrt(8))
    assert _bits(attn.output_proj.weight) == _bits(expected)


def test_stacked_mlp_scan_unchanged(getkey):
    key = getkey()
    scanned = nn.MLP(3, 2, 8, 4, scan=True, key=key)
    plain = nn.MLP(3, 2, 8, 4, key=key)
    assert _bits(scanned.layers[1].weight[1]) == _bits(plain.layers[2].weight)


# ------------------------------------------------------ weight_init / bias_init
def test_weight_and_bias_init_keywords(getkey):
    ones, zeros = jax.nn.initializers.ones, jax.nn.initializers.zeros
    layer = nn.Linear(3, 2, weight_init=ones, bias_init=zeros, key=getkey())
    assert (np.asarray(layer.weight) == 1).all() and (np.asarray(layer.bias) == 0).all()
    conv = nn.ConvTranspose1d(2, 4, 3, weight_init=ones, key=getkey())
    assert (np.asarray(conv.weight) == 1).all() and conv.bias.shape == (4, 1)
    conv = nn.Conv3d(2, 4, 1, bias_init=ones, key=getkey())
    assert (np.asarray(conv.bias) == 1).all() and conv.bias.shape == (4, 1, 1, 1)
    table = nn.Embedding(5, 2, weight_init=zeros, key=getkey())
    assert (np.asarray(table.weight) == 0).all()
    ortho = jax.nn.initializers.orthogonal()
    attn = nn.MultiheadAttention(2, 4, use_query_bias=True, weight_init=ortho,
                                 bias_init=ones, key=getkey())  # fmt: skip
    w = attn.query_proj.weight
    # (a TPU's QR and product are float32 to a few ulps, not to the CPU's one)
    assert jnp.allclose(w @ w.T, jnp.eye(4), atol=tolerance(cpu=1e-5, accelerator=1e-4))
    assert (np.asarray(attn.query_proj.bias) == 1).all()


def test_init_keyword_receives_key_shape_dtype(getkey):
    seen = []

    def record(key, shape, dtype):
        seen.append((shape, jnp.dtype(dtype)))
        return jr.normal(key, shape, dtype)

    key = getkey()
    layer = nn.Linear(3, 2, dtype=jnp.bfloat16, weight_init=record, key=key)
    # JAX's convention (in, out), stored transposed as (out, in)
    assert seen == [((3, 2), jnp.dtype(jnp.bfloat16))]
    expected = jr.normal(jr.split(key)[0], (3, 2), jnp.bfloat16).T
    assert _bits(layer.weight) == _bits(expected)


def test_init_keyword_errors(getkey):
    with pytest.raises(TypeError, match=r"Linear: `weight_init` must be a function"):
        nn.Linear(3, 2, weight_init="ones", key=getkey())
    with pytest.raises(TypeError, match=r"Conv2d: `bias_init` must be a function"):
        nn.Conv2d(3, 2, 1, bias_init=1.0, key=getkey())
    bad = lambda key, shape, dtype: jnp.zeros((1,), dtype)
    with pytest.raises(ValueError, match=r"Embedding: `weight_init` returned \(1,\)"):
        nn.Embedding(4, 2, weight_init=bad, key=getkey())


# -------------------------------------------------------------------- nn.init
def test_nn_init_where(getkey):
    mlp = nn.MLP(3, 2, 4, 2, key=getkey())
    key = getkey()
    ortho = jax.nn.initializers.orthogonal()
    new = nn.init(mlp, lambda m: [layer.weight for layer in m.layers], ortho, key=key)
    keys = jr.split(key, 3)
    for layer, old, k in zip(new.layers, mlp.layers, keys):
        drawn = ortho(k, old.weight.shape[::-1], jnp.float32)  # (in, out)
        assert _bits(layer.weight) == _bits(drawn.T)
        assert layer.bias is old.bias


def test_nn_init_subtree_and_filter(getkey):
    mlp = nn.MLP(3, 2, 4, 1, key=getkey())
    zeros = jax.nn.initializers.zeros
    new = nn.init(mlp, lambda m: m.layers[0], zeros, key=getkey())
    assert (np.asarray(new.layers[0].weight) == 0).all() and (
        np.asarray(new.layers[0].bias) == 0
    ).all()
    assert new.layers[1].weight is mlp.layers[1].weight
    new = nn.init(mlp, initializer=zeros, filter=lambda x: x.ndim == 1, key=getkey())
    assert all((np.asarray(layer.bias) == 0).all() for layer in new.layers)
    assert new.layers[0].weight is mlp.layers[0].weight


def test_nn_init_errors(getkey):
    mlp = nn.MLP(3, 2, 4, 1, key=getkey())
    ortho = jax.nn.initializers.orthogonal()
    with pytest.raises(ValueError, match=r"rejected `layers\.0\.bias` of shape \(4,\)"):
        nn.init(mlp, lambda m: m.layers[0], ortho, key=getkey())
    with pytest.raises(ValueError, match=r"`filter` selected no arrays"):
        nn.init(mlp, initializer=ortho, filter=lambda x: x.ndim == 3, key=getkey())
    with pytest.raises(ValueError, match=r"`where` returned None \(item 0\)"):
        nn.init(nn.Linear(2, 2, use_bias=False, key=getkey()), lambda m: m.bias,
                ortho, key=getkey())  # fmt: skip
    with pytest.raises(ValueError, match=r"returned \(2,\) for `layers\.1\.weight`"):
        nn.init(mlp, lambda m: m.layers[1].weight,
                lambda k, s, d: jnp.zeros((2,), d), key=getkey())  # fmt: skip
    with pytest.raises(TypeError, match=r"exactly one of `where`"):
        nn.init(mlp, initializer=ortho, key=getkey())
    with pytest.raises(TypeError, match=r"`initializer` must be a function"):
        nn.init(mlp, lambda m: m.layers[0].weight, "ortho", key=getkey())


# ------------------------------------------------------------------ nn.Stacked
class _Block(boxwood.Module):
    norm: nn.LayerNorm
    attn: nn.MultiheadAttention
    mlp: nn.MLP
    scale: jax.Array

    def __init__(self, key):
        k1, k2, k3 = jr.split(key, 3)
        self.norm = nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(2, 8, key=k1)
        self.mlp = nn.MLP(8, 8, 16, 1, key=k2)
        self.scale = jr.normal(k3, (8,)) / 8

    def __call__(self, x):
        return x


def test_stacked_build_matches_filter_vmap(getkey, monkeypatch):
    key = getkey()
    stacked = nn.Stacked(_Block, 3, key=key)
    direct = boxwood.filter_vmap(_Block)(jr.split(key, 3))
    fast_leaves = jax.tree_util.tree_leaves(stacked.layers)
    assert len(fast_leaves) == len(jax.tree_util.tree_leaves(direct)) == 11
    for a, b in zip(fast_leaves, jax.tree_util.tree_leaves(direct)):
        assert _bits(a) == _bits(b)


def test_stacked_falls_back_to_filter_vmap(getkey):
    counter = iter(range(100))

    class Counted(boxwood.Module):
        weight: jax.Array
        count: int

        def __init__(self, key):
            self.weight = jr.normal(key, (2,))
            self.count = next(counter)

    key = getkey()
    stacked = nn.Stacked(Counted, 3, key=key)  # layers differ in `count`
    assert stacked.layers.count == 3  # one vmapped trace, after three eager builds
    assert _bits(stacked.layers.weight[2]) == _bits(
        jr.normal(jr.split(key, 3)[2], (2,))
    )
    traced = jax.jit(lambda k: nn.Stacked(_Block, 2, key=k).layers.scale)(key)
    assert _bits(traced) == _bits(nn.Stacked(_Block, 2, key=key).layers.scale)
