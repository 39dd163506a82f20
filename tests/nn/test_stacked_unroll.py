"""`Stacked(unroll=...)` and the models' `with_unroll`: the layers scanned `n` at a
time, or applied in a Python loop with no scan, each still rematerialised on its
own; the same numbers, the same checkpoints, and the default program unchanged."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _jaxprs import all_equations, primitive_names
from _tiny_causal_lms import gpt2 as _gpt2
from _tiny_causal_lms import llama as _llama

IDS = jnp.asarray(np.random.RandomState(2).randint(3, 97, size=7), jnp.int32)


class Block(boxwood.Module):
    weight: jax.Array

    def __init__(self, width, *, key):
        self.weight = jr.normal(key, (width, width)) / width

    def __call__(self, x, *, key=None):
        noise = 0.0 if key is None else 0.1 * jr.normal(key, x.shape)
        return x + jnp.tanh(self.weight @ x) + noise


def _stack(depth=3, **kw):
    return boxwood.nn.Stacked(lambda k: Block(4, key=k), depth, key=jr.key(0), **kw)


def _names(fn, *args):
    return primitive_names(jax.make_jaxpr(fn)(*args).jaxpr)


def _equations(fn, args, name):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return [eqn for eqn in all_equations(jaxpr) if eqn.primitive.name == name]


def _count(fn, args, name):
    return len(_equations(fn, args, name))


def _close(a, b):
    # XLA fuses and sums a scanned program and an unrolled one in different
    # orders: float32 sums of terms of order one differ by about 1e-6 absolute
    # (a Llama's gradient entry of 0.013 in its sum of squares: 1.3e-6)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("unroll", [True, 2, 5])
def test_stack_values_and_gradients_equal_the_scan(unroll):
    scanned, x, key = _stack(), jnp.linspace(-1.0, 1.0, 4), jr.key(1)
    unrolled = scanned.with_unroll(unroll)
    # (True == 1 in Python: the types are compared too)
    assert (unrolled.unroll, type(unrolled.unroll)) == (unroll, type(unroll))
    assert (scanned.unroll, type(scanned.unroll)) == (1, int)
    loss = boxwood.filter_value_and_grad(lambda s: jnp.sum(s(x, key=key) ** 2))
    ys = lambda s: s.scan(lambda layer, c, i: (layer(c), c * i), x, jnp.arange(3.0))
    both = boxwood.filter_jit(lambda s: (loss(s), ys(s)))
    _close(*boxwood.filter_jit(lambda a, b: (both(a), both(b)))(unrolled, scanned))


def test_true_is_a_loop_and_an_int_a_scan():
    x = jnp.ones(4)
    call = lambda s, x: s(x)
    assert "scan" not in _names(call, _stack(unroll=True), x)
    assert _count(call, (_stack(unroll=True), x), "unstack") == 1  # one per array
    assert _count(call, (_stack(unroll=True), x), "tanh") == 3
    for unroll in (1, 2):
        (eqn,) = _equations(call, (_stack(unroll=unroll), x), "scan")
        assert eqn.params["unroll"] == unroll


def test_default_program_is_unchanged():
    x = jnp.ones(4)
    step = lambda layer, c, _: (layer(c), None)
    text = lambda s: str(jax.make_jaxpr(lambda s: s.scan(step, x))(s))
    default = text(_stack())
    assert default == text(_stack(unroll=1)) == text(_stack(unroll=False))
    assert default == text(_stack(unroll=True).with_unroll(1))
    assert default != text(_stack(unroll=2))


def test_remat_checkpoints_each_layer_when_unrolled():
    x = jnp.ones(4)
    grad = jax.grad(lambda s: jnp.sum(s(x)))
    unrolled = _stack(remat=True, unroll=True)
    assert _count(grad, (unrolled,), "remat2") == 3
    assert _count(grad, (unrolled.with_remat(False),), "remat2") == 0
    assert _count(grad, (_stack(remat=True),), "remat2") == 1  # in the scan's body


def test_unroll_is_static_and_tells_programs_apart():
    stack = _stack()
    unrolled = stack.with_unroll(True)
    assert jax.tree_util.tree_leaves(unrolled)[0] is jax.tree_util.tree_leaves(stack)[0]
    # `True == 1`: the treedefs (and so compiled code) must still differ
    assert jax.tree_util.tree_structure(unrolled) != jax.tree_util.tree_structure(stack)
    call = boxwood.filter_jit(lambda s: jnp.sum(s(jnp.ones(4))))
    call(stack)
    call(unrolled)
    assert call.cache_info().traces == 2


@pytest.mark.parametrize("bad", [0, -2, 1.5, "full", None, [2]])
def test_bad_unroll_is_an_error(bad):
    match = r"Stacked: `unroll` must be a positive int .*, True .* or False .*; got"
    with pytest.raises(ValueError, match=match):
        _stack(unroll=bad)
    with pytest.raises(ValueError, match=match):
        _stack().with_unroll(bad)
    with pytest.raises(ValueError, match=match):
        _llama().with_unroll(bad)


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_unrolled_model_equals_the_scanned_one(make):
    model = make()  # two blocks
    loss = lambda m: jnp.sum(m(IDS) ** 2)
    grad = boxwood.filter_value_and_grad(loss)
    unrolled = model.with_unroll(True)
    assert "scan" not in _names(grad, unrolled)
    assert "scan" in _names(loss, model.with_unroll(2))
    _close(*boxwood.filter_jit(lambda a, b: (grad(a), grad(b)))(unrolled, model))
    # remat still wraps each block
    full = unrolled.with_remat("full")
    assert _count(boxwood.filter_grad(loss), (full,), "remat2") == 2
    # the default program: `with_unroll(1)` is the model as built
    text = lambda m: str(jax.make_jaxpr(loss)(m))
    assert text(model) == text(model.with_unroll(1)) == text(unrolled.with_unroll(1))


def test_unrolled_decode_over_a_prompt_equals_the_scan():
    model = _llama()
    unrolled = model.with_unroll(True)
    run = boxwood.filter_jit(lambda m: m.decode(IDS[:4], m.init_cache(8), 0))
    _close(run(unrolled), run(model))


def test_encoders_unroll():
    config = bm.BertConfig(
        vocab_size=17, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16,
    )  # fmt: skip
    bert = boxwood.nn.inference_mode(bm.BertForMaskedLM(config, key=jr.key(3)))
    config = bm.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, image_size=8, patch_size=4,
    )  # fmt: skip
    vit = boxwood.nn.inference_mode(bm.ViTForImageClassification(config, key=jr.key(4)))
    ids, pixels = IDS % 17, jr.normal(jr.key(5), (3, 8, 8))
    for model, x in ((bert, ids), (vit, pixels)):
        unrolled = model.with_unroll(True)
        assert "scan" in _names(lambda m, x: m(x), model, x)
        assert "scan" not in _names(lambda m, x: m(x), unrolled, x)
        call = boxwood.filter_jit(lambda m, x: (m(x), m.with_unroll(True)(x)))
        _close(*call(model, x))


def test_with_unroll_keeps_checkpoints(tmp_path):
    model = _gpt2()
    unrolled = model.with_unroll(True)
    assert boxwood.state_dict(unrolled).keys() == boxwood.state_dict(model).keys()
    boxwood.save(tmp_path / "unrolled.safetensors", unrolled)
    loaded = boxwood.load(tmp_path / "unrolled.safetensors", model)
    scanned = loaded.transformer.h.unroll
    assert (scanned, type(scanned)) == (1, int) and bool(
        boxwood.tree_equal(loaded, model)
    )
    again = boxwood.load(tmp_path / "unrolled.safetensors", unrolled)
    assert again.transformer.h.unroll is True
    unrolled.save_pretrained(tmp_path / "pretrained")
    reloaded = bm.from_pretrained(tmp_path / "pretrained")
    assert type(reloaded.transformer.h.unroll) is int
    assert boxwood.state_dict(reloaded).keys() == boxwood.state_dict(model).keys()
    call = boxwood.filter_jit(lambda a, b: (a(IDS), b(IDS)))
    _close(*call(reloaded.with_unroll(True), model))
