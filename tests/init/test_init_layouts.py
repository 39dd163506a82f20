"""Initialisers see a parameter's fan-in and fan-out as JAX and Flax do (axis -2 is
the input, axis -1 the output), in every layer and in `nn.init`; JAX's common
initialisers run on the fast path, bit for bit."""

import functools

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from flax import nnx

import boxwood.nn as nn
from boxwood._init import _draw
from boxwood._init._jax_initializers import fast_call

inits = jax.nn.initializers
INITS = {
    "lecun_normal": inits.lecun_normal(),
    "glorot_uniform": inits.glorot_uniform(),
    "he_normal": inits.he_normal(),
    "fan_in_uniform": inits.variance_scaling(1.0, "fan_in", "uniform"),
    "fan_out_normal": inits.variance_scaling(1.0, "fan_out", "normal"),
    "fan_avg_truncated": inits.variance_scaling(1.0, "fan_avg", "truncated_normal"),
}


def _bits(x):
    return np.asarray(x).tobytes()


# --------------------------------------------------------------- bit identity
@pytest.mark.parametrize(
    "fn",
    [*INITS.values(), inits.glorot_normal(), inits.lecun_uniform(), inits.normal(0.02),
     inits.uniform(0.3), inits.truncated_normal(0.7, -1.5, 2.0),
     inits.variance_scaling(0.4, "fan_geo_avg", "normal", in_axis=0, out_axis=1),
     inits.orthogonal(), inits.orthogonal(scale=1.7, column_axis=0)],
)  # fmt: skip
@pytest.mark.parametrize("shape", [(128, 32), (3, 3, 8, 16), (5, 2, 70)])
def test_fast_path_is_bit_identical(fn, shape):
    # orthogonal's QR is on the host only where it matches JAX's: the CPU backend
    # (docs/initialisation.md); elsewhere it takes the direct call
    host_qr = jax.default_backend() == "cpu"
    for key in (jr.key(3), jr.PRNGKey(4)):
        fast = fast_call(fn, key, shape, jnp.float32)
        if not host_qr and fn.__code__ is inits.orthogonal().__code__:
            assert fast is None
            continue
        assert fast is not None
        direct = fn(key, shape, jnp.float32)
        assert fast.dtype == direct.dtype and _bits(fast) == _bits(direct)


def test_fast_path_declines_what_it_does_not_know():
    key = jr.key(0)
    assert fast_call(inits.orthogonal(), key, (4,), jnp.float32) is None  # JAX raises
    assert fast_call(inits.orthogonal(), key, (0, 4), jnp.float32) is None
    assert fast_call(inits.lecun_normal(), key, (4, 4), jnp.bfloat16) is None
    assert fast_call(lambda k, s, d: jnp.zeros(s, d), key, (4,), jnp.float32) is None
    # a shape JAX rejects goes to the direct call, which raises JAX's error
    assert fast_call(inits.lecun_normal(), key, (4,), jnp.float32) is None


# ------------------------------------------------------------ shapes handed over
def _recorder(seen):
    def record(key, shape, dtype):
        seen.append(tuple(shape))
        return jnp.arange(np.prod(shape), dtype=dtype).reshape(shape)

    return record


@pytest.mark.parametrize(
    "make, weight_shape, bias_shape, stored_weight",
    [
        (lambda r: nn.Linear(5, 3, weight_init=r, bias_init=r, key=jr.key(0)),
         (5, 3), (3,), lambda w: w.T),
        (lambda r: nn.Conv2d(4, 6, (2, 3), weight_init=r, bias_init=r, key=jr.key(0)),
         (2, 3, 4, 6), (6,), lambda w: w.transpose(3, 2, 0, 1)),
        (lambda r: nn.Conv1d(4, 6, 3, groups=2, weight_init=r, bias_init=r,
                             key=jr.key(0)),
         (3, 2, 6), (6,), lambda w: w.transpose(2, 1, 0)),
        (lambda r: nn.ConvTranspose3d(2, 3, (1, 2, 3), weight_init=r, bias_init=r,
                                      key=jr.key(0)),
         (1, 2, 3, 2, 3), (3,), lambda w: w.transpose(4, 3, 0, 1, 2)),
    ],
)  # fmt: skip
def test_layers_call_initialisers_in_jax_convention(
    make, weight_shape, bias_shape, stored_weight
):
    seen = []
    layer = make(_recorder(seen))
    assert seen == [weight_shape, bias_shape]
    drawn = jnp.arange(np.prod(weight_shape), dtype=jnp.float32).reshape(weight_shape)
    assert jnp.array_equal(layer.weight, stored_weight(drawn))
    assert layer.bias.reshape(-1).tolist() == list(range(bias_shape[0]))


def test_embedding_and_attention_shapes():
    seen = []
    nn.Embedding(7, 3, weight_init=_recorder(seen), key=jr.key(0))
    assert seen == [(7, 3)]  # (num_embeddings, features), as nnx.Embed
    seen.clear()
    nn.MultiheadAttention(2, 4, 6, 5, 8, weight_init=_recorder(seen), key=jr.key(0))
    # (in, heads * size) for query, key, value; (heads * size, out) for the output
    assert seen == [(4, 4), (6, 4), (5, 4), (4, 8)]


def test_wrong_shape_from_initialiser_names_both_shapes():
    bad = lambda key, shape, dtype: jnp.zeros((3, 5), dtype)
    with pytest.raises(
        ValueError,
        match=r"Linear: `weight_init` returned \(3, 5\), but it was called with shape "
        r"\(5, 3\) \(stored as \(3, 5\)\)",
    ):
        nn.Linear(5, 3, weight_init=bad, key=jr.key(0))


# ---------------------------------------------------- distribution, against NNX
# Each variance is estimated from at least 2**16 draws: its relative standard
# error is about sqrt(2 / n) < 0.6% (less for the uniform and truncated normal,
# whose kurtosis is lower), so two estimates of the same variance differ by more
# than 5% with probability well below 1e-12. A wrong fan changes the variance by
# a factor of 2 or more in every case below (fan-in != fan-out).
N_MIN = 1 << 16


def _draws(make, get):
    out, seed = [], 0
    while sum(x.size for x in out) < N_MIN:
        out.append(np.asarray(get(make(seed))).ravel())
        seed += 1
    return np.concatenate(out)


def _boxwood_rnn(cls, fn, sizes):
    def make(seed):
        cell = cls(*sizes, key=jr.key(seed))
        where = lambda c: (c.weight_ih, c.weight_hh)
        return nn.init(cell, where, fn, key=jr.key(seed + 1000))

    return make


PAIRS = {
    "linear": (
        lambda fn: lambda s: nn.Linear(512, 128, weight_init=fn, key=jr.key(s)),
        lambda m: m.weight,
        lambda fn: lambda s: nnx.Linear(512, 128, kernel_init=fn, rngs=nnx.Rngs(s)),
        lambda m: m.kernel[...],
    ),
    # the convolutions: N_MIN draws from one layer, as the others (not a layer
    # built again per seed); fans 144 and 4608, 5120 and 80
    "conv": (
        lambda fn: lambda s: nn.Conv2d(16, 512, 3, weight_init=fn, key=jr.key(s)),
        lambda m: m.weight,
        lambda fn: lambda s: nnx.Conv(16, 512, (3, 3), kernel_init=fn,
                                      rngs=nnx.Rngs(s)),
        lambda m: m.kernel[...],
    ),
    "conv_transpose": (
        lambda fn: lambda s: nn.ConvTranspose1d(1024, 16, 5, weight_init=fn,
                                                key=jr.key(s)),
        lambda m: m.weight,
        lambda fn: lambda s: nnx.ConvTranspose(1024, 16, (5,), kernel_init=fn,
                                               rngs=nnx.Rngs(s)),
        lambda m: m.kernel[...],
    ),
    "embedding": (
        lambda fn: lambda s: nn.Embedding(256, 512, weight_init=fn, key=jr.key(s)),
        lambda m: m.weight,
        lambda fn: lambda s: nnx.Embed(256, 512, embedding_init=fn, rngs=nnx.Rngs(s)),
        lambda m: m.embedding[...],
    ),
    "gru": (
        # sizes that give N_MIN draws from one cell (fans 1024 and 192)
        lambda fn: _boxwood_rnn(nn.GRUCell, fn, (1024, 64)),
        lambda m: m.weight_ih,
        lambda fn: lambda s: nnx.GRUCell(1024, 64, kernel_init=fn, rngs=nnx.Rngs(s)),
        lambda m: m.dense_i.kernel[...],
    ),
    "lstm": (
        lambda fn: _boxwood_rnn(nn.LSTMCell, fn, (16, 128)),  # fans 128 and 512
        lambda m: m.weight_hh,
        lambda fn: lambda s: nnx.OptimizedLSTMCell(16, 128, recurrent_kernel_init=fn,
                                                   rngs=nnx.Rngs(s)),
        lambda m: m.dense_h.kernel[...],
    ),
}  # fmt: skip


@pytest.mark.parametrize("init_name", list(INITS))
@pytest.mark.parametrize("layer", list(PAIRS))
def test_same_distribution_as_nnx(layer, init_name):
    fn = INITS[init_name]
    make_bw, get_bw, make_nnx, get_nnx = PAIRS[layer]
    ours, theirs = _draws(make_bw(fn), get_bw), _draws(make_nnx(fn), get_nnx)
    assert abs(ours.mean()) < 5 * ours.std() / np.sqrt(ours.size)
    np.testing.assert_allclose(ours.var(), theirs.var(), rtol=0.05)


def test_attention_projection_variance_matches_nnx():
    # nnx.MultiHeadAttention's query kernel is (in, heads, head_dim), initialised
    # as the (in, heads * head_dim) matrix; boxwood's query projection likewise.
    fn = inits.glorot_uniform()
    ours = _draws(
        lambda s: nn.MultiheadAttention(4, 256, qk_size=16, weight_init=fn,
                                        key=jr.key(s)),
        lambda m: m.query_proj.weight,
    )  # fmt: skip
    theirs = _draws(
        lambda s: nnx.MultiHeadAttention(4, 256, qkv_features=64, kernel_init=fn,
                                         decode=False, rngs=nnx.Rngs(s)),
        lambda m: m.query.kernel[...],
    )  # fmt: skip
    np.testing.assert_allclose(ours.var(), theirs.var(), rtol=0.05)
    np.testing.assert_allclose(ours.var(), 2 / (256 + 64), rtol=0.05)


# -------------------------------------------------------------------- nn.init
@functools.cache
def _mlp():
    """Built once and shared (a module is immutable; `nn.init` returns a new one).
    Two hidden layers of one shape, so that a shape repeats within a call, but
    no more: each 256 x 256 orthogonal draw is a QR decomposition, on the host and
    again in the eager reference."""
    return nn.MLP(64, 10, 256, 3, key=jr.key(0))


@pytest.mark.parametrize("name", ["lecun_normal", "glorot_uniform", "orthogonal"])
def test_nn_init_bit_identical_to_per_leaf_calls(name):
    fn = inits.orthogonal() if name == "orthogonal" else INITS[name]
    mlp, key = _mlp(), jr.key(7)
    new = nn.init(mlp, lambda m: [layer.weight for layer in m.layers], fn, key=key)
    for layer, k in zip(new.layers, jr.split(key, len(new.layers))):
        out, inp = layer.weight.shape
        assert _bits(layer.weight) == _bits(fn(k, (inp, out), jnp.float32).T)


def test_nn_init_compiles_once_per_distribution(count_compiles, monkeypatch):
    # (a process's first 4M drawn elements are hashed on the host; start afresh so
    # that the switch to the device-bits kernel does not fall inside the block)
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    mlp = _mlp()
    weights = lambda m: [layer.weight for layer in m.layers]
    nn.init(mlp, weights, inits.he_normal(), key=jr.key(1))  # warm the kernels
    nn.init(mlp, weights, inits.orthogonal(), key=jr.key(1))  # and the QR check
    with count_compiles() as compiles:
        nn.init(mlp, weights, inits.lecun_normal(), key=jr.key(2))
        nn.init(mlp, weights, inits.glorot_normal(), key=jr.key(3))
        # orthogonal: the normal draw on the kernel, the QR on the host (on the
        # CPU backend; elsewhere the direct call, compiled per shape)
        if jax.default_backend() == "cpu":
            nn.init(mlp, weights, inits.orthogonal(), key=jr.key(4))
    assert compiles == []


def test_nn_init_compiles_nothing_for_new_shapes(count_compiles, monkeypatch):
    # the transpose into boxwood's (out, in) layout is done on the host: shapes
    # never seen before compile nothing once the distribution's kernel is warm
    monkeypatch.setattr(_draw, "_host_hashed", 0)
    weights = lambda m: [layer.weight for layer in m.layers]
    nn.init(_mlp(), weights, inits.lecun_normal(), key=jr.key(1))
    fresh = nn.MLP(37, 5, 91, 2, key=jr.key(0))  # shapes of no other test
    with count_compiles() as compiles:
        new = nn.init(fresh, weights, inits.lecun_normal(), key=jr.key(2))
    assert compiles == []
    for layer, k in zip(new.layers, jr.split(jr.key(2), len(new.layers))):
        out, inp = layer.weight.shape
        expected = inits.lecun_normal()(k, (inp, out), jnp.float32).T
        assert _bits(layer.weight) == _bits(expected)
        assert not layer.weight.committed  # placed as the model's other arrays


def test_to_stored_keeps_a_committed_array_where_it_is():
    from boxwood._init._layout import to_stored

    device = jax.devices()[-1]
    value = jax.device_put(jnp.arange(6.0).reshape(2, 3), device)
    out = to_stored(value, (3, 2), "dense")
    assert out.committed and out.devices() == {device}
    np.testing.assert_array_equal(out, np.arange(6.0).reshape(2, 3).T)
    conv = jnp.arange(24.0).reshape(2, 3, 4)  # (spatial, in, out), uncommitted
    out = to_stored(conv, (4, 3, 2), "conv")
    np.testing.assert_array_equal(out, np.asarray(conv).transpose(2, 1, 0))
    assert not out.committed


def test_orthogonal_takes_the_direct_call_where_the_host_qr_differs(monkeypatch):
    from boxwood._init import _jax_initializers

    monkeypatch.setattr(_jax_initializers, "_qr_matches_jax", lambda dtype: False)
    assert fast_call(inits.orthogonal(), jr.key(0), (8, 4), jnp.float32) is None
    # and an initialiser off the fast path compiles once per distinct shape (3 in
    # this MLP), not once per operation and leaf
    mlp = _mlp()
    new = nn.init(mlp, lambda m: [layer.weight for layer in m.layers],
                  inits.orthogonal(), key=jr.key(4))  # fmt: skip
    w = np.asarray(new.layers[1].weight, np.float64)  # on the host: exact products
    np.testing.assert_allclose(w @ w.T, np.eye(256), atol=1e-5)


def test_the_host_qr_check_compares_with_jax():
    from boxwood._init import _jax_initializers

    assert _jax_initializers._qr_matches_jax(np.dtype(np.float32)) == (
        jax.default_backend() == "cpu"
    )


def test_nn_init_conv_and_rnn_layouts():
    conv = nn.Conv2d(4, 6, (2, 3), key=jr.key(0))
    seen = []
    new = nn.init(conv, lambda c: (c.weight, c.bias), _recorder(seen), key=jr.key(1))
    assert seen == [(2, 3, 4, 6), (6,)]
    assert new.weight.shape == (6, 4, 2, 3) and new.bias.shape == (6, 1, 1)
    seen.clear()
    nn.init(nn.GRUCell(3, 5, key=jr.key(0)), lambda c: c.weight_hh, _recorder(seen),
            key=jr.key(1))  # fmt: skip
    assert seen == [(5, 15)]


def test_nn_init_stacked_layers_draw_each_layer_with_its_fans():
    stacked = nn.Stacked(lambda k: nn.Linear(48, 12, key=k), 3, key=jr.key(0))
    fn, key = inits.lecun_normal(), jr.key(5)
    new = nn.init(stacked, lambda s: s.layers.weight, fn, key=key)
    assert new.layers.weight.shape == (3, 12, 48)
    # one key per selected array, split again into one per layer
    for j, k in enumerate(jr.split(jr.split(key, 1)[0], 3)):
        assert _bits(new.layers.weight[j]) == _bits(fn(k, (48, 12), jnp.float32).T)
