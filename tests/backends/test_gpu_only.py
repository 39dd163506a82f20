"""Tests that only a GPU can run (they skip elsewhere; the README names them):
cuDNN's fused attention against XLA's, and a failed `error_if` check raised by
the call itself where dispatch is asynchronous (the suite sets
`BOXWOOD_SYNC_CHECKS=1` off the CPU, tests/conftest.py; without it the failure
raises at the function's next call). Run them with
`python -m pytest tests/backends/test_gpu_only.py` on a machine whose JAX sees a GPU
(`python benchmarks/accelerator.py` benchmarks any backend)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.models as bm

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="needs a GPU (JAX's default backend)"
)

# bfloat16 heads of 64 channels: a shape and dtype cuDNN's flash attention takes.
SIZES = dict(
    vocab_size=256,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=128,
)
IDS = jnp.asarray(np.random.RandomState(0).randint(0, 256, size=64), jnp.int32)


def _bf16(model):
    return bw.cast_floating(model, jnp.bfloat16)


def _logits(model, implementation):
    model = model.with_attention_implementation(implementation)
    return np.asarray(jax.jit(model)(IDS), np.float32)


@pytest.mark.parametrize(
    "build",
    [
        lambda: bm.LlamaForCausalLM(bm.LlamaConfig(**SIZES), key=jax.random.key(0)),
        lambda: bm.MistralForCausalLM(
            bm.MistralConfig(**SIZES, sliding_window=16), key=jax.random.key(1)
        ),
    ],
    ids=["llama_gqa_causal", "mistral_window"],
)
def test_cudnn_attention_equals_xla_in_a_model(build):
    model = _bf16(build())
    xla, cudnn = _logits(model, "xla"), _logits(model, "cudnn")
    # bfloat16 logits of magnitude ~1: a few bfloat16 ulps apart at most
    np.testing.assert_allclose(cudnn, xla, atol=5e-2, rtol=5e-2)
    assert (cudnn.argmax(-1) == xla.argmax(-1)).mean() > 0.9


def test_half_precision_models_choose_cudnn_by_themselves():
    model = _bf16(bm.LlamaForCausalLM(bm.LlamaConfig(**SIZES), key=jax.random.key(0)))
    lowered = jax.jit(lambda ids: model(ids)).lower(IDS).as_text()
    assert "cudnn" in lowered.lower()  # the fused kernel's custom call
    full = jax.jit(lambda ids: bw.cast_floating(model, jnp.float32)(ids))
    assert "cudnn" not in full.lower(IDS).as_text().lower()  # float32: XLA's


def test_cudnn_single_head_attention_equals_xla():
    keys = jax.random.split(jax.random.key(2), 3)
    q, k, v = (jax.random.normal(key, (128, 64), jnp.bfloat16) for key in keys)
    mask = jnp.tril(jnp.ones((128, 128), bool))
    out = {
        impl: np.asarray(
            bw.nn.dot_product_attention(q, k, v, mask, implementation=impl),
            np.float32,
        )
        for impl in ("xla", "cudnn")
    }
    np.testing.assert_allclose(out["cudnn"], out["xla"], atol=3e-2, rtol=3e-2)


def test_a_failed_check_raises_from_the_call_on_the_gpu():
    @bw.filter_jit
    def f(x):
        return bw.error_if(x, x < 0, "negative on the GPU")

    assert jax.devices()[0].platform == "gpu"
    with pytest.raises(bw.BoxwoodRuntimeError, match="negative on the GPU"):
        f(jnp.array(-1.0))
    # a passing call still returns its value, and the next failure raises again
    assert float(f(jnp.array(2.0))) == 2.0
    with pytest.raises(bw.BoxwoodRuntimeError, match="negative on the GPU"):
        f(jnp.array(-3.0))
