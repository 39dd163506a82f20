"""Which attention implementation `boxwood.nn` and `boxwood.models` ask JAX for:
cuDNN's flash attention on a GPU for half-precision heads it takes, with a
fallback to XLA's attention where JAX refuses it while tracing; XLA's elsewhere.
A GPU is simulated by reporting it as JAX's default backend (on this CPU JAX then
refuses cuDNN, "cuDNN is not detected", which exercises the fallback)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.models as bm

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="simulates a GPU on the CPU; tests/backends/test_gpu_only.py checks a real one",
)
HEADS = jax.random.normal(jax.random.key(0), (3, 1, 16, 2, 64), jnp.bfloat16)


@pytest.fixture
def asked(monkeypatch):
    """The `implementation` of every `jax.nn.dot_product_attention` call."""
    calls = []
    real = jax.nn.dot_product_attention

    def spy(*args, implementation=None, **kwargs):
        calls.append(implementation)
        return real(*args, implementation=implementation, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return calls


def _as_gpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


def _fused(**kwargs):
    from boxwood._kernels import fused_attention

    q, k, v = HEADS
    return jax.make_jaxpr(lambda q, k, v: fused_attention(q, k, v, **kwargs))(q, k, v)


def test_on_a_gpu_half_precision_heads_ask_for_cudnn_then_fall_back(monkeypatch, asked):
    with jax.numpy_dtype_promotion("standard"):
        expected = jax.make_jaxpr(
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)
        )(*HEADS)
    asked.clear()
    _as_gpu(monkeypatch)
    got = _fused(is_causal=True)
    assert asked == ["cudnn", None]  # cuDNN refused here ("not detected"), then XLA
    assert str(got) == str(expected)


@pytest.mark.parametrize(
    "case",
    ["cpu", "float32", "mask", "head size 36", "head size 160", "explicit xla"],
)
def test_xla_is_asked_for_directly_where_cudnn_does_not_apply(monkeypatch, asked, case):
    q, k, v = HEADS
    kwargs: dict = {}
    if case != "cpu":
        _as_gpu(monkeypatch)
    if case == "float32":
        q, k, v = (a.astype(jnp.float32) for a in HEADS)
    if case == "mask":
        kwargs["mask"] = jnp.tril(jnp.ones((16, 16), bool))[None, None]
    if case.startswith("head size"):
        size = int(case.split()[-1])
        q, k, v = (jnp.zeros((1, 16, 2, size), jnp.bfloat16),) * 3
    if case == "explicit xla":
        kwargs["implementation"] = "xla"
    from boxwood._kernels import fused_attention

    jax.make_jaxpr(lambda q, k, v: fused_attention(q, k, v, **kwargs))(q, k, v)
    assert asked == [kwargs.get("implementation")]


def test_an_explicit_cudnn_request_is_not_swallowed():
    from boxwood._kernels import fused_attention

    with pytest.raises(RuntimeError, match="cuDNN"):
        jax.make_jaxpr(
            lambda q, k, v: fused_attention(q, k, v, implementation="cudnn")
        )(*HEADS)


def test_a_model_on_a_gpu_asks_for_cudnn_and_computes_the_same(monkeypatch, asked):
    config = bm.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=32,
    )
    model = bw.cast_floating(
        bm.LlamaForCausalLM(config, key=jax.random.key(1)), jnp.bfloat16
    )
    ids = jnp.arange(12, dtype=jnp.int32) % 64
    reference = np.asarray(jax.jit(lambda ids: model(ids))(ids), np.float32)
    assert asked == [None]  # the CPU: XLA's attention, asked for once (scanned)
    asked.clear()
    _as_gpu(monkeypatch)
    got = np.asarray(jax.jit(lambda ids: model(ids))(ids), np.float32)
    assert asked == ["cudnn", None]
    np.testing.assert_array_equal(got, reference)


def test_multihead_attention_on_a_gpu_asks_for_cudnn(monkeypatch, asked):
    layer = bw.nn.MultiheadAttention(
        num_heads=2, query_size=16, dtype=jnp.bfloat16, key=jax.random.key(2)
    )
    x = jnp.ones((5, 16), jnp.bfloat16)
    reference = np.asarray(layer(x, x, x), np.float32)
    asked.clear()
    _as_gpu(monkeypatch)
    got = np.asarray(jax.jit(lambda x: layer(x, x, x))(x), np.float32)
    assert asked == ["cudnn", None]
    np.testing.assert_array_equal(got, reference)
