"""What only a TPU can check: the splash kernel compiled for the chip (not
Pallas's interpret mode, which tests/nn/test_attention_splash.py runs on the CPU)
against XLA's attention, boxwood's choice of it for a model's training step, and
that the training steps of docs/models.md, "Fitting the chip", fit one TPU v5e's
15.75 GiB (compiled from shapes alone: nothing is allocated). Skipped elsewhere."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import boxwood as bw
import boxwood.models as bm
from _jaxprs import all_equations
from boxwood._kernels import _fused_attention

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "tpu",
    reason="needs a TPU (JAX's default backend): the compiled splash kernel and the "
    "chip's memory; the CPU runs the kernel in interpret mode in "
    "tests/nn/test_attention_splash.py",
)

CHIP_GIB = 15.75  # a TPU v5e's HBM


def _heads(shape, kv_heads, seed=0):
    batch, seq, heads, size = shape
    kv = (batch, seq, kv_heads, size)
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(
        jax.random.normal(key, s, jnp.bfloat16)
        for key, s in zip(keys, (shape, kv, kv), strict=True)
    )


def _pallas_calls(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return sum(e.primitive.name == "pallas_call" for e in all_equations(jaxpr.jaxpr))


def _value_and_grads(fn, *args):
    def loss(*args):  # a cotangent that is not uniform
        out = fn(*args).astype(jnp.float32)
        return jnp.sum(out * jax.random.normal(jax.random.key(9), out.shape))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(*args)


@pytest.mark.parametrize(
    "shape, kv_heads",
    [((4, 1024, 12, 64), 12), ((1, 2048, 32, 64), 8)],
    ids=["gpt2-small heads", "llama-852m grouped-query heads"],
)
def test_compiled_splash_kernel_matches_xla_in_bfloat16(shape, kv_heads):
    heads = _heads(shape, kv_heads)

    def attention(impl):
        return lambda q, k, v: _fused_attention.fused_attention(
            q, k, v, is_causal=True, implementation=impl
        )

    assert _pallas_calls(attention("splash"), *heads) == 1
    # compiled for the chip (a Mosaic custom call), not interpreted
    assert "tpu_custom_call" in jax.jit(attention("splash")).lower(*heads).as_text()
    out = np.asarray(jax.jit(attention("splash"))(*heads), np.float32)
    want = np.asarray(jax.jit(attention("xla"))(*heads), np.float32)
    # bfloat16 outputs of about unit size: a few of their ulps (0.0156 measured)
    assert np.abs(out - want).max() <= 0.04
    _, grads = _value_and_grads(attention("splash"), *heads)
    # the reference: JAX's XLA attention, whose bfloat16 gradient mixes float32 and
    # bfloat16 operands that the suite's strict promotion refuses
    with jax.numpy_dtype_promotion("standard"):
        _, want_grads = _value_and_grads(attention("xla"), *heads)
    for name, g, w in zip("qkv", grads, want_grads, strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        error = np.abs(g - w).max() / np.abs(w).max()
        assert error <= 2e-2, (name, error)


def test_compiled_splash_kernel_in_float32_at_highest_precision():
    """Float32 heads keep the program's precision inside the kernel (the suite runs
    at `highest` here); bfloat16 ones (above) are traced at the default."""
    heads = tuple(h.astype(jnp.float32) for h in _heads((2, 512, 4, 64), 4))

    def attention(impl):
        return jax.jit(
            lambda q, k, v: _fused_attention.fused_attention(
                q, k, v, is_causal=True, implementation=impl
            )
        )

    out = np.asarray(attention("splash")(*heads))
    want = np.asarray(attention("xla")(*heads))
    assert np.abs(out - want).max() <= 1e-3


def _small_gpt2(attn_pdrop):
    config = bm.GPT2Config(
        vocab_size=256, n_positions=256, n_embd=128, n_layer=2, n_head=2,
        attn_pdrop=attn_pdrop,
    )  # fmt: skip
    model = bm.GPT2LMHeadModel(config, key=jax.random.key(0))
    return bw.cast_floating(model, jnp.bfloat16)


@pytest.mark.parametrize("attn_pdrop, splash", [(0.0, True), (0.1, False)])
def test_none_chooses_splash_for_a_training_step(attn_pdrop, splash):
    """On one TPU, `attention_implementation=None` computes a training step's
    attention with the splash kernel, unless attention dropout is active (that
    forms the `seq x seq` weights, to drop some)."""
    model = _small_gpt2(attn_pdrop)
    assert model.attention_implementation is None
    ids = jnp.zeros((2, 256), jnp.int32)
    floats, static = bw.partition(model, bw.is_inexact_array)

    def loss(floats):
        return bm.causal_lm_loss(bw.combine(floats, static), ids, key=jax.random.key(1))

    calls = _pallas_calls(jax.value_and_grad(loss), floats)
    assert (calls > 0) == splash, calls


def _step_gib(model, batch, seq):
    """GiB one donated AdamW training step of `model` (abstract) needs at its peak,
    as XLA's buffer assignment on this chip says."""

    def is_array(x):
        return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))

    params, static = bw.partition(model, is_array)
    optimizer = optax.adamw(3e-4, weight_decay=0.1)
    state = jax.eval_shape(optimizer.init, params)

    def step(ids, params, state):
        def loss(p):
            return bm.causal_lm_loss(bw.combine(p, static), ids, key=jax.random.key(0))

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    # optax's bias correction raises a Python float to the int32 step count, which
    # the suite's strict promotion refuses
    with jax.numpy_dtype_promotion("standard"):
        lowered = jax.jit(step, donate_argnums=(1, 2)).lower(ids, params, state)
    assert "tpu_custom_call" in lowered.as_text()  # splash, by boxwood's choice
    m = lowered.compile().memory_analysis()
    used = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
    return (used - m.alias_size_in_bytes) / 2**30


def test_gpt2_small_training_step_fits_the_chip():
    """GPT-2-small, bfloat16 parameters, AdamW, 16 x 1024 tokens, attention left to
    boxwood (splash), no attention dropout, remat of the weight products' outputs."""
    config = bm.GPT2Config(attn_pdrop=0.0)  # GPT-2-small
    model = bw.filter_eval_shape(
        lambda: bw.cast_floating(
            bm.GPT2LMHeadModel(config, key=jax.random.key(0)), jnp.bfloat16
        )
    ).with_remat("dots_with_no_batch_dims_saveable")
    gib = _step_gib(model, 16, 1024)
    assert gib < CHIP_GIB, gib


def test_llama_852m_training_step_fits_the_chip():
    """The Llama-style 852M model (hidden 2048, 16 layers, 32 query and 8 key/value
    heads, intermediate 5632, vocabulary 32000, untied), as above at 4 x 2048."""
    config = bm.LlamaConfig(
        hidden_size=2048, num_hidden_layers=16, intermediate_size=5632,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
        max_position_embeddings=2048, tie_word_embeddings=False,
        attention_dropout=0.0,
    )  # fmt: skip
    model = bw.filter_eval_shape(
        lambda: bw.cast_floating(
            bm.LlamaForCausalLM(config, key=jax.random.key(0)), jnp.bfloat16
        )
    ).with_remat("dots_with_no_batch_dims_saveable")
    gib = _step_gib(model, 4, 2048)
    assert gib < CHIP_GIB, gib
