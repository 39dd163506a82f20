"""Splash attention (JAX's Pallas TPU kernel) as attention implementation
`"splash"`: on this CPU it runs in Pallas's interpret mode, which computes what
the kernel computes on a TPU (slowly: the shapes here are tiny). Forward against
XLA's attention for `boxwood.nn` and every model family, and the gradient for
each attention code path; the
choice `implementation=None` makes with the backend reported as a TPU; a
sharded model under a mesh (simulated devices, in a subprocess); and that a
training step with splash holds no `seq x seq` array."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
import boxwood.models as bm
from _child_flags import child_env
from _jaxprs import all_equations
from boxwood._kernels import _fused_attention, _splash
from boxwood.nn import _attention

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="interpret mode on the CPU"
)
TOL = dict(rtol=2e-5, atol=2e-5)


def _heads(shape, kv_heads=None, seed=0, dtype=jnp.float32):
    batch, seq, heads, size = shape
    kv = (batch, seq, kv_heads or heads, size)
    keys = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(keys[0], shape, dtype),
        jax.random.normal(keys[1], kv, dtype),
        jax.random.normal(keys[2], kv, dtype),
    )


def _value_and_grad(fn, n_args):
    """`fn`'s value and its gradient with respect to each of its `n_args` arguments."""

    def loss(*args):  # a cotangent that is not uniform
        out = fn(*args)
        return jnp.sum(out * jax.random.normal(jax.random.key(9), out.shape))

    return jax.value_and_grad(loss, argnums=tuple(range(n_args)))


def _splash_and_xla_grads(fn, *args):
    """The values of `fn("splash")` and `fn("xla")` and their gradients with
    respect to every argument, in one jit (one compile, not two)."""

    def both(*args):
        return tuple(
            _value_and_grad(fn(i), len(args))(*args) for i in ("splash", "xla")
        )

    return jax.jit(both)(*args)


def _assert_close(got, want, **tol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **(tol or TOL))


def _pallas_calls(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args)
    return sum(e.primitive.name == "pallas_call" for e in all_equations(jaxpr.jaxpr))


@pytest.mark.parametrize(
    "case",
    [
        "causal, grouped-query heads",
        "sliding window, one key head, padded length",
        "segment ids, full mask, padded length",
    ],
)
def test_fused_attention_splash_matches_xla(case):
    kwargs: dict = {}
    if case.startswith("causal"):
        heads = _heads((1, 256, 4, 64), kv_heads=2)
        kwargs.update(is_causal=True)
    elif case.startswith("sliding"):
        heads = _heads((1, 200, 2, 64), kv_heads=1)
        kwargs.update(is_causal=True, local_window_size=(37, 0))
    else:
        heads = _heads((1, 150, 2, 128))
        ids = jnp.asarray([[1] * 90 + [2] * 60], jnp.int32)
        kwargs.update(segment_ids=(ids, ids))
    fn = lambda impl: (
        lambda q, k, v: _fused_attention.fused_attention(
            q, k, v, implementation=impl, **kwargs
        )
    )
    assert _pallas_calls(fn("splash"), *heads) == 1
    assert _pallas_calls(fn("xla"), *heads) == 0
    _assert_close(*_splash_and_xla_grads(fn, *heads))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_products_under_highest_precision(dtype):
    """Mosaic cannot compile a product of bfloat16 operands at float32-contract
    precision: under `jax_default_matmul_precision="highest"` the kernel's
    products (forward and gradient) of bfloat16 heads are traced at the default,
    while float32 heads keep `highest`."""
    heads = _heads((1, 256, 2, 64), dtype=dtype)

    def loss(*heads):
        out = _fused_attention.fused_attention(
            *heads, is_causal=True, implementation="splash"
        )
        return out.astype(jnp.float32).sum()

    with jax.default_matmul_precision("highest"):
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*heads)
    kernels = [
        e for e in all_equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"
    ]
    precisions = {
        e.params["precision"]
        for call in kernels
        for e in all_equations(call.params["jaxpr"])
        if e.primitive.name == "dot_general"
    }
    assert len(kernels) == 2  # the forward kernel and the fused gradient one
    highest = (jax.lax.Precision.HIGHEST,) * 2
    default = (jax.lax.Precision.DEFAULT,) * 2
    assert precisions == ({highest} if dtype == jnp.float32 else {default})


def test_building_the_kernel_compiles_nothing_the_callers_context_has(count_compiles):
    """Building a splash kernel stages its mask arrays onto the device by small
    programs that JAX caches per trace context. boxwood builds it in the
    caller's context, not inside the default matrix-product precision its
    bfloat16 products are traced at, so a first trace compiles no program that
    building the same kernel in the caller's context has compiled already
    (built inside that precision, two more compiled on every first step)."""
    heads = _heads((1, 256, 2, 64), dtype=jnp.bfloat16)
    attend = lambda q, k, v: _fused_attention.fused_attention(
        q, k, v, is_causal=True, implementation="splash"
    )
    arguments = (True, None, 2, 256, 256, False, True)  # as `attend` builds it
    _splash._kernel.cache_clear()
    _splash._kernel(*arguments)  # in this context: its programs compile here
    _splash._kernel.cache_clear()
    with count_compiles() as compiled:
        jax.make_jaxpr(attend)(*heads)
    assert compiled == []
    assert _splash._kernel.cache_info().currsize == 1  # the kernel was built again


def test_segment_ids_mask_xla_attention():
    """Through XLA's attention a query attends only to keys of its own segment."""
    q, k, v = _heads((1, 6, 1, 8))
    ids = jnp.asarray([[0, 0, 1, 1, 1, 2]], jnp.int32)

    @jax.jit
    def pieces(q, k, v):
        out = _fused_attention.fused_attention(
            q, k, v, segment_ids=(ids, ids), is_causal=True
        )
        alone = [
            _fused_attention.fused_attention(
                q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True
            )
            for a, b in ((0, 2), (2, 5), (5, 6))
        ]
        return out, jnp.concatenate(alone, axis=1)

    out, alone = pieces(q, k, v)
    np.testing.assert_allclose(out, alone, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"`segment_ids` must be a pair of integer"):
        _fused_attention.fused_attention(q, k, v, segment_ids=(ids[:, :5], ids))


def test_nn_attention_with_splash():
    """`dot_product_attention` and `MultiheadAttention` (with a `(kv_seq,)`
    padding mask, which reaches the kernel as segment ids) match XLA's."""
    q, k, v = (x[0, :, 0] for x in _heads((1, 128, 1, 64), seed=1))
    fn = lambda impl: (
        lambda q, k, v: _attention.dot_product_attention(q, k, v, implementation=impl)
    )
    _assert_close(*jax.jit(lambda *h: (fn("splash")(*h), fn("xla")(*h)))(q, k, v))

    layer = lambda impl: bw.nn.MultiheadAttention(
        2, 128, implementation=impl, key=jax.random.key(2)
    )
    x = jax.random.normal(jax.random.key(3), (2, 100, 128))
    real = jnp.arange(100)[None] < jnp.asarray([[70], [100]])  # row 0: 70 real

    def run(impl):
        attn = layer(impl)
        return lambda x: jax.vmap(lambda x, m: attn(x, x, x, m))(x, real)

    assert _pallas_calls(run("splash"), x) == 1
    _assert_close(*_splash_and_xla_grads(run, x), rtol=1e-4, atol=1e-4)
    # the 2-d mask of the same padding gives what the padding mask gives
    square = jnp.broadcast_to(real[:, None, :], (2, 100, 100))
    two_d = lambda x: jax.vmap(lambda x, m: layer(None)(x, x, x, m))(x, square)
    _assert_close(*jax.jit(lambda x: (two_d(x), run(None)(x)))(x), rtol=1e-6, atol=1e-6)


def test_multihead_attention_implementation_errors():
    with pytest.raises(ValueError, match="`implementation` must be None"):
        bw.nn.MultiheadAttention(2, 8, implementation="flash", key=jax.random.key(0))
    layer = bw.nn.MultiheadAttention(
        2, 8, dropout_p=0.5, implementation="splash", key=jax.random.key(0)
    )
    x = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="`implementation='splash'` computes"):
        layer(x, x, x, key=jax.random.key(1))
    with pytest.raises(ValueError, match="a multiple of 8, got 4"):  # head size
        layer(x, x, x, inference=True)


def test_asking_for_splash_where_it_cannot_run_names_the_shapes():
    q = jnp.zeros((1, 128, 2, 64), jnp.float16)
    with pytest.raises(
        ValueError, match=r"'splash' cannot take heads of shapes.*float32 or bfloat16"
    ):
        _fused_attention.fused_attention(q, q, q, implementation="splash")
    q = jnp.zeros((1, 128, 2, 12))
    with pytest.raises(ValueError, match="a multiple of 8, got 12"):
        _fused_attention.fused_attention(q, q, q, implementation="splash")
    # a call with an explicit mask (a decoding step over a cache) is XLA's
    q = jnp.zeros((1, 128, 2, 64))
    mask = jnp.tril(jnp.ones((128, 128), bool))[None, None]
    assert (
        _pallas_calls(
            lambda q: _fused_attention.fused_attention(
                q, q, q, mask=mask, implementation="splash"
            ),
            q,
        )
        == 0
    )


@pytest.fixture
def tpu(monkeypatch):
    """The backend reported as a TPU: `implementation=None` then picks splash
    where it applies (traced only: it could not run here without interpret)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")


@pytest.mark.parametrize(
    "case, splash",
    [
        ("fits", True),
        ("bfloat16", True),
        ("grouped-query heads", True),
        ("segment ids", True),
        ("length 200", False),
        ("float16", False),
        ("explicit mask", False),
        ("two devices, no mesh", False),
    ],
)
def test_none_picks_splash_on_a_tpu_where_it_applies(tpu, monkeypatch, case, splash):
    q, k, v = _heads((1, 256, 4, 64), kv_heads=2 if "grouped" in case else None)
    kwargs: dict = dict(is_causal=True)
    if case in ("bfloat16", "float16"):
        q, k, v = (x.astype(case) for x in (q, k, v))
    if case == "length 200":
        q, k, v = (x[:, :200] for x in (q, k, v))
    if case == "segment ids":
        kwargs["segment_ids"] = (jnp.zeros((1, 256), jnp.int32),) * 2
    if case == "explicit mask":
        kwargs["mask"] = jnp.tril(jnp.ones((256, 256), bool))[None, None]
    if case.startswith("two devices"):
        monkeypatch.setattr(jax, "device_count", lambda *a: 2)
    fn = lambda q, k, v: _fused_attention.fused_attention(q, k, v, **kwargs)
    assert _pallas_calls(fn, q, k, v) == int(splash)


def test_none_falls_back_to_xla_where_splash_refuses_while_tracing(tpu, monkeypatch):
    def refuse(*args, **kwargs):
        raise NotImplementedError("not on this chip")

    monkeypatch.setattr(_splash, "splash_attention", refuse)
    q, k, v = _heads((1, 128, 2, 64))
    both = lambda q, k, v: (
        _fused_attention.fused_attention(q, k, v, is_causal=True),
        _fused_attention.fused_attention(q, k, v, is_causal=True, implementation="xla"),
    )
    got, want = jax.jit(both)(q, k, v)  # the refusal comes while tracing, as eagerly
    np.testing.assert_array_equal(got, want)


def test_block_sizes():
    assert [_splash.block_size(n) for n in (128, 256, 384, 512, 640, 1024, 1536)] == [
        128, 256, 384, 512, 128, 512, 512,
    ]  # fmt: skip
    # from 2048 tokens on, 1024 where it divides
    assert [_splash.block_size(n) for n in (2048, 2560, 3072, 4096)] == [
        1024, 512, 1024, 1024,
    ]  # fmt: skip
    assert [_splash.padded_length(n) for n in (1, 128, 129, 197)] == [
        128,
        128,
        256,
        256,
    ]


def _causal_lms():
    common = dict(vocab_size=17, hidden_size=128, intermediate_size=16)
    llama = dict(
        **common, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
        max_position_embeddings=128,
    )  # fmt: skip
    return {
        "gpt2": lambda: bm.GPT2LMHeadModel(
            bm.GPT2Config(
                vocab_size=17, n_positions=128, n_embd=128, n_layer=1, n_head=2
            ),
            key=jax.random.key(0),
        ),
        "llama": lambda: bm.LlamaForCausalLM(
            bm.LlamaConfig(**llama), key=jax.random.key(1)
        ),
        "mistral": lambda: bm.MistralForCausalLM(
            bm.MistralConfig(**llama, sliding_window=40), key=jax.random.key(2)
        ),
        "qwen2": lambda: bm.Qwen2ForCausalLM(
            bm.Qwen2Config(**llama), key=jax.random.key(3)
        ),
        "gemma": lambda: bm.GemmaForCausalLM(
            bm.GemmaConfig(**{**llama, "head_dim": 64}), key=jax.random.key(4)
        ),
    }


def _compare(loss, floats, gradient):
    """Splash's value (and, with `gradient`, its gradient) against XLA's."""
    if gradient:
        got, want = _splash_and_xla_grads(loss, floats)
    else:
        got, want = jax.jit(lambda f: (loss("splash")(f), loss("xla")(f)))(floats)
    _assert_close(got, want, rtol=1e-4, atol=1e-4)


# Qwen2 and Gemma run Llama's attention code, ViT BERT's: their forward passes
# are compared; the gradient through each attention code path once.
@pytest.mark.parametrize(
    "family, gradient",
    [
        ("gpt2", True),
        ("llama", True),
        ("mistral", True),
        ("qwen2", False),
        ("gemma", False),
    ],
)
def test_causal_lm_families_with_splash(family, gradient):
    # evaluation: the splash path is what is compared, not dropout
    model = bw.nn.inference_mode(_causal_lms()[family]())
    assert (
        model.with_attention_implementation("splash").attention_implementation
        == "splash"
    )
    ids = jax.random.randint(jax.random.key(5), (1, 100), 0, 17)
    floats, static = bw.partition(model, bw.is_inexact_array)

    def loss(impl):
        return lambda floats: jax.vmap(
            bw.combine(floats, static).with_attention_implementation(impl)
        )(ids)

    assert _pallas_calls(loss("splash"), floats) == 1  # the layers are scanned
    _compare(loss, floats, gradient)


@pytest.mark.parametrize("family, gradient", [("bert", True), ("vit", False)])
def test_encoder_families_with_splash(family, gradient):
    if family == "bert":
        config = bm.BertConfig(
            vocab_size=17, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=16, max_position_embeddings=128,
        )  # fmt: skip
        model = bm.BertModel(config, key=jax.random.key(6))
        ids = jax.random.randint(jax.random.key(7), (2, 100), 0, 17)
        real = (jnp.arange(100)[None] < jnp.asarray([[60], [100]])).astype(jnp.int32)
        call = lambda m: jax.vmap(m)(ids, real)
    else:
        config = bm.ViTConfig(
            hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=16, image_size=16, patch_size=4,
        )  # fmt: skip
        model = bm.ViTForImageClassification(config, key=jax.random.key(6))
        pixels = jax.random.normal(jax.random.key(7), (1, 3, 16, 16))
        call = lambda m: jax.vmap(m)(pixels)
    # evaluation: the splash path is what is compared, not dropout
    model = bw.nn.inference_mode(model)
    floats, static = bw.partition(model, bw.is_inexact_array)

    def loss(impl):
        return lambda floats: call(
            bw.combine(floats, static).with_attention_implementation(impl)
        )

    assert _pallas_calls(loss("splash"), floats) == 1
    _compare(loss, floats, gradient)
    with pytest.raises(ValueError, match="must be None .boxwood's choice.*'splash'"):
        model.with_attention_implementation("flash")


def _seq_by_seq_arrays(jaxpr, seq):
    """The values of `jaxpr` (nested jaxprs included) with two axes of `seq`."""
    found = []
    for eqn in all_equations(jaxpr):
        for var in eqn.outvars:
            shape = getattr(var.aval, "shape", ())
            if sum(d == seq for d in shape) >= 2:
                found.append((eqn.primitive.name, shape))
    return found


def test_a_training_step_with_splash_holds_no_seq_by_seq_array():
    # 640 tokens: splash blocks of 128, so no array of the kernel is 640 x 640
    seq = 640
    # training mode: embedding and residual dropout active; dropout on the
    # attention probabilities off, as docs/models.md's recipe sets it (active, it
    # forms the weights explicitly)
    config = bm.GPT2Config(
        vocab_size=61, n_positions=seq, n_embd=128, n_layer=2, n_head=2,
        attn_pdrop=0.0,
    )  # fmt: skip
    model = bm.GPT2LMHeadModel(config, key=jax.random.key(0))
    ids = jnp.zeros((2, seq), jnp.int32)
    floats, static = bw.partition(model, bw.is_inexact_array)

    def step(impl):
        def loss(floats):
            m = bw.combine(floats, static).with_attention_implementation(impl)
            return bm.causal_lm_loss(m, ids, key=jax.random.key(1))

        return jax.make_jaxpr(jax.value_and_grad(loss))(floats).jaxpr

    assert _seq_by_seq_arrays(step("xla"), seq)  # XLA's attention forms the weights
    assert _seq_by_seq_arrays(step("splash"), seq) == []


SHARDED = r"""
import jax
jax.config.update("jax_num_cpu_devices", 4)
import jax.numpy as jnp, numpy as np
import boxwood as bw, boxwood.models as bm
from _jaxprs import all_equations
from jax.sharding import PartitionSpec as P

config = bm.LlamaConfig(
    vocab_size=61, hidden_size=256, intermediate_size=64, num_attention_heads=4,
    num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=128,
)
mesh = bw.make_mesh((2, 2), ("data", "model"))
model = bm.LlamaForCausalLM(config, key=jax.random.key(0))
model = bw.shard(model, mesh, bm.sharding_rules(model, "tensor_parallel"))
ids = bw.shard_batch(jax.random.randint(jax.random.key(1), (4, 128), 0, 61), mesh)
floats, static = bw.partition(model, bw.is_inexact_array)

def loss(impl):
    def fn(floats):
        m = bw.combine(floats, static).with_attention_implementation(impl)
        return bm.causal_lm_loss(m, ids)
    return jax.jit(jax.value_and_grad(fn))

with jax.set_mesh(mesh):
    jaxpr = jax.make_jaxpr(loss("splash"))(floats)
    got = loss("splash")(floats)
want = loss("xla")(floats)
maps = [e for e in all_equations(jaxpr.jaxpr) if e.primitive.name == "shard_map"]
assert len(maps) == 2, len(maps)  # the forward and the backward kernel
specs = {s for e in maps for s in e.params["in_specs"]}
assert P("data", None, "model", None) in specs, specs
for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
print("SPLASH-SHARDED-OK")
"""


def test_a_sharded_model_runs_splash_inside_shard_map():
    here = os.path.dirname(os.path.dirname(__file__))  # tests/, the helpers
    # simulated CPU devices whatever this process's backend (a chip is held here)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, env.get("PYTHONPATH", "")) if p
    )
    result = subprocess.run(
        [sys.executable, "-c", SHARDED],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "SPLASH-SHARDED-OK" in result.stdout, result.stderr[-3000:]


def test_a_padded_causal_batch_takes_splash_as_segment_ids():
    """An `attention_mask` reaches the kernel as segment ids (no explicit mask,
    so splash is kept), and the real positions' logits are XLA's."""
    model = bw.nn.inference_mode(_causal_lms()["llama"]())
    ids = jax.random.randint(jax.random.key(8), (2, 100), 0, 17)
    mask = (jnp.arange(100)[None] >= jnp.asarray([[30], [0]])).astype(jnp.int32)
    floats, static = bw.partition(model, bw.is_inexact_array)

    def logits(impl):
        return lambda floats: jax.vmap(
            bw.combine(floats, static).with_attention_implementation(impl)
        )(ids, mask)

    assert _pallas_calls(logits("splash"), floats) == 1
    splash, xla = jax.jit(lambda f: (logits("splash")(f), logits("xla")(f)))(floats)
    real = mask.astype(bool)
    np.testing.assert_allclose(splash[real], xla[real], rtol=1e-4, atol=1e-4)
