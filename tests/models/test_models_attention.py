"""Attention of `boxwood.models`' causal language models: left padding (`pad` of
`decode`), grouped-query attention without repeated keys, the attention
implementation option, the hidden states and output embedding, and bfloat16."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _tiny_causal_lms import SMALL_LLAMA
from _tiny_causal_lms import gpt2 as _gpt2
from _tiny_causal_lms import llama as _llama
from _tiny_causal_lms import mistral as _mistral
from _tiny_causal_lms import qwen2_mixed as _qwen2_mixed
from boxwood.models._attend import Step, _explicit, _visible, attend

MODELS = {"gpt2": _gpt2, "llama": _llama, "mistral": _mistral, "qwen2": _qwen2_mixed}
IDS = jnp.asarray(np.random.RandomState(0).randint(3, 97, size=10), jnp.int32)
PAD = 3


@functools.cache
def _model(kind):
    """One model per kind for the module (models are immutable)."""
    return MODELS[kind]()


def _left_padded(ids, pad):
    return jnp.concatenate([jnp.full((pad,), 7, jnp.int32), ids])


@boxwood.filter_jit
def _forwards(model):
    """Every forward pass the tests below check, in one compiled program per model:
    the plain logits, the hidden states, a left-padded row with and without `pad`,
    and a vmapped batch of left-padded rows through a cache, then a cached step."""
    padded = _left_padded(IDS, PAD)
    rows = jnp.stack([_left_padded(IDS[:8], 2), jnp.concatenate([IDS[:8], IDS[:2]])])
    pads = jnp.array([2, 0], jnp.int32)
    lasts = jnp.array([IDS[8], IDS[2]], jnp.int32)

    def run(row, pad, last):
        state = model.init_cache(16)
        first, state = model.decode(row, state, 0, pad)
        nxt, _ = model.decode(last[None], state, jnp.int32(10), pad)
        return first, nxt[0]

    hidden = model.hidden_states(IDS)
    first, nxt = jax.vmap(run)(rows, pads, lasts)
    return dict(
        full=model(IDS),
        hidden=hidden,
        product=hidden @ model.output_embedding().T,
        padded=model.decode(padded, None, 0, jnp.int32(PAD))[0],
        ignored=model.decode(padded, None, 0)[0],
        first=first,
        nxt=nxt,
    )


@functools.cache
def _outputs(kind):
    return _forwards(_model(kind))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_left_padded_row_equals_the_unpadded_sequence(kind):
    out = _outputs(kind)
    expected = out["full"]
    np.testing.assert_allclose(out["padded"][PAD:], expected, rtol=1e-5, atol=1e-5)
    # without `pad` the padding is attended to and shifts the positions
    assert np.abs(np.asarray(out["ignored"][PAD:] - expected)).max() > 1e-3


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_vmapped_pads_with_a_cache_then_a_cached_step(kind):
    out = _outputs(kind)
    expected, first, nxt = out["full"], out["first"], out["nxt"]
    np.testing.assert_allclose(first[0, 2:], expected[:8], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first[1, :8], expected[:8], rtol=1e-5, atol=1e-5)
    # row 0 continued at slot 10 is position 8 of the unpadded sequence
    np.testing.assert_allclose(nxt[0], expected[8], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_logits_are_hidden_states_times_output_embedding(kind):
    model, out = _model(kind), _outputs(kind)
    assert out["hidden"].shape == (IDS.shape[0], 32)
    assert model.output_embedding().shape == (97, 32)
    np.testing.assert_array_equal(out["full"], out["product"])


def test_output_embedding_is_lm_head_when_untied():
    config = bm.LlamaConfig(**SMALL_LLAMA, num_hidden_layers=1)
    model = bm.LlamaForCausalLM(config, key=jax.random.key(0))
    assert model.lm_head is not None
    assert model.output_embedding() is model.lm_head.weight


def _shapes(jaxpr, found):
    for eqn in jaxpr.eqns:
        found.update(tuple(v.aval.shape) for v in eqn.outvars)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    _shapes(sub.jaxpr, found)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    _shapes(sub, found)
    return found


def _keys_per_query_head(fn, *args, length=24, heads=4, dim=8):
    """Shapes in `fn`'s jaxpr with the cache length, all query heads and the head
    size: keys or values repeated for every query head."""
    shapes = _shapes(jax.make_jaxpr(fn)(*args).jaxpr, set())
    return [s for s in shapes if {length, heads, dim} <= set(s)]


def test_grouped_query_attention_does_not_repeat_keys():
    model = _model("llama")  # 4 query heads, 2 key/value heads of 8 channels

    def step(model, ids):
        return model.decode(ids, model.init_cache(24), 0)[0]

    assert not _keys_per_query_head(step, model, IDS[:5])
    # the check sees repeated keys where they are made
    repeated = lambda c: jnp.repeat(c, 2, axis=2) * 2.0
    assert _keys_per_query_head(repeated, jnp.zeros((2, 24, 2, 8)))


def test_attention_implementation_option():
    model = _model("llama")
    xla = model.with_attention_implementation("xla")
    assert xla.attention_implementation == "xla"
    assert model.attention_implementation is None
    np.testing.assert_allclose(
        boxwood.filter_jit(lambda m: m(IDS))(xla),
        _outputs("llama")["full"],
        rtol=1e-6,
        atol=1e-6,
    )
    built = bm.GPT2LMHeadModel(
        _model("gpt2").config, key=jax.random.key(0), attention_implementation="xla"
    )
    assert built.attention_implementation == "xla"


def test_bad_attention_implementation():
    with pytest.raises(
        ValueError, match=r"`attention_implementation` must be .*'flash'"
    ):
        _model("llama").with_attention_implementation("flash")
    with pytest.raises(
        ValueError, match=r"GPT2LMHeadModel: `attention_implementation`"
    ):
        bm.GPT2LMHeadModel(
            _model("gpt2").config,
            key=jax.random.key(0),
            attention_implementation="cuda",
        )


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("cached", [False, True])
def test_fused_attention_equals_the_explicit_softmax(window, cached):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (6, 4, 8))
    k = jax.random.normal(keys[1], (6, 2, 8))
    v = jax.random.normal(keys[2], (6, 2, 8))
    step = Step(0, None, cached)

    # one compiled program (eagerly, each of the many small operations compiles
    # on its own): the fused attention of float32 and of bfloat16 inputs, and the
    # explicit softmax
    @jax.jit
    def compared(q, k, v):
        low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
        explicit = _explicit(q, k, v, _visible(step, 6, 6, window))
        return attend(q, k, v, step, window), attend(*low, step, window), explicit

    fused, out, reference = compared(q, k, v)
    np.testing.assert_allclose(fused, reference, atol=1e-6)
    # bfloat16 inputs: within bfloat16 rounding of the float32 result
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), reference, atol=3e-2)


def test_bfloat16_model_is_close_to_float32():
    # cast in one program (eagerly, each leaf's shape compiles a cast of its own)
    low = boxwood.filter_jit(
        lambda model: jax.tree_util.tree_map(
            lambda x: x.astype(jnp.bfloat16) if boxwood.is_array(x) else x, model
        )
    )(_model("llama"))

    @boxwood.filter_jit
    def both(low):
        upcast = jax.tree_util.tree_map(
            lambda x: x.astype(jnp.float32) if boxwood.is_array(x) else x, low
        )
        return low(IDS), upcast(IDS)

    out, reference = both(low)
    assert out.dtype == jnp.bfloat16
    scale = float(jnp.abs(reference).max())
    assert float(jnp.abs(out.astype(jnp.float32) - reference).max()) <= 0.05 * scale
