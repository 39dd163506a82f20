"""The hand-written pure-JAX peers of `benchmarks/accelerator.py` and
`benchmarks/train_curve.py`: GPT-2 and a Llama-style model as dicts of arrays,
their blocks stacked (a leading layer axis) and applied with `lax.scan` under the
same rematerialisation policy as boxwood's `with_remat`, with the attention kernel
of `_acc_attention`; a `jax.jit` training step (optax AdamW, donated parameters
and state); greedy GPT-2 generation over a key/value cache.

Shapes follow boxwood's models: GPT-2's projections are `(in, out)` matrices and
its query/key/value projection is one fused matrix (`from_boxwood_gpt2` copies a
boxwood model's arrays in), Llama's are `(in, out)` too (boxwood's `Linear` is
`(out, in)`; the layout does not change the arithmetic). Norm statistics, the
softmax and the loss are float32, as boxwood computes them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from _acc_attention import attention

F32 = jnp.float32


def checkpointed(fn: Any, remat: str | None) -> Any:
    """`fn` under `jax.checkpoint` as boxwood's `with_remat(remat)` puts a block:
    `None`/"none": not at all, "full": everything recomputed, else the
    `jax.checkpoint_policies` of that name."""
    if remat in (None, "none"):
        return fn
    if remat == "full":
        return jax.checkpoint(fn)
    return jax.checkpoint(fn, policy=getattr(jax.checkpoint_policies, remat))


def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array, eps: float) -> jax.Array:
    wide = x.astype(F32)
    centred = wide - wide.mean(-1, keepdims=True)
    scale = jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + eps)
    return (centred * scale * g.astype(F32) + b.astype(F32)).astype(x.dtype)


def rms_norm(x: jax.Array, g: jax.Array, eps: float) -> jax.Array:
    wide = x.astype(F32)
    scale = jax.lax.rsqrt((wide * wide).mean(-1, keepdims=True) + eps)
    return (wide * scale * g.astype(F32)).astype(x.dtype)


def _normal(key: jax.Array, shape: tuple, dtype: Any, std: float = 0.02) -> jax.Array:
    return (std * jax.random.normal(key, shape, F32)).astype(dtype)


# --------------------------------------------------------------------------- GPT-2


def gpt2_init(o: dict, key: jax.Array, dtype: Any) -> dict:
    """Parameters of a GPT-2 of `transformers` options `o` (random, std 0.02)."""
    d, layers, inner = o["n_embd"], o["n_layer"], 4 * o["n_embd"]
    k = jax.random.split(key, 6)

    def ones(*s):
        return jnp.ones(s, dtype)

    def zeros(*s):
        return jnp.zeros(s, dtype)

    blocks = dict(
        ln1_g=ones(layers, d), ln1_b=zeros(layers, d),
        attn_w=_normal(k[0], (layers, d, 3 * d), dtype), attn_b=zeros(layers, 3 * d),
        proj_w=_normal(k[1], (layers, d, d), dtype), proj_b=zeros(layers, d),
        ln2_g=ones(layers, d), ln2_b=zeros(layers, d),
        fc_w=_normal(k[2], (layers, d, inner), dtype), fc_b=zeros(layers, inner),
        out_w=_normal(k[3], (layers, inner, d), dtype), out_b=zeros(layers, d),
    )  # fmt: skip
    return dict(
        wte=_normal(k[4], (o["vocab_size"], d), dtype),
        wpe=_normal(k[5], (o["n_positions"], d), dtype, 0.01),
        blocks=blocks,
        lnf_g=ones(d),
        lnf_b=zeros(d),
    )


def from_boxwood_gpt2(model: Any) -> dict:
    """The arrays of a boxwood `GPT2LMHeadModel` in `gpt2_init`'s tree (the same
    layout: nothing is transposed)."""
    t = model.transformer
    h = t.h.layers
    blocks = dict(
        ln1_g=h.ln_1.weight, ln1_b=h.ln_1.bias,
        attn_w=h.attn.c_attn.weight, attn_b=h.attn.c_attn.bias,
        proj_w=h.attn.c_proj.weight, proj_b=h.attn.c_proj.bias,
        ln2_g=h.ln_2.weight, ln2_b=h.ln_2.bias,
        fc_w=h.mlp.c_fc.weight, fc_b=h.mlp.c_fc.bias,
        out_w=h.mlp.c_proj.weight, out_b=h.mlp.c_proj.bias,
    )  # fmt: skip
    out = dict(wte=t.wte.weight, wpe=t.wpe.weight, blocks=blocks,
               lnf_g=t.ln_f.weight, lnf_b=t.ln_f.bias)  # fmt: skip
    return jax.tree.map(jnp.array, out)  # fresh buffers: the step donates them


def _gpt2_qkv(p: dict, x: jax.Array, heads: int, eps: float) -> tuple:
    b, t, d = x.shape
    h = layer_norm(x, p["ln1_g"], p["ln1_b"], eps)
    qkv = (h @ p["attn_w"] + p["attn_b"]).reshape(b, t, 3, heads, d // heads)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def _gpt2_rest(p: dict, x: jax.Array, a: jax.Array, eps: float) -> jax.Array:
    x = x + a.reshape(x.shape) @ p["proj_w"] + p["proj_b"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"], eps)
    h = jax.nn.gelu(h @ p["fc_w"] + p["fc_b"], approximate=True)
    return x + h @ p["out_w"] + p["out_b"]


def gpt2_hidden(
    params: dict, ids: jax.Array, o: dict, kind: str, remat: Any
) -> jax.Array:
    """Final normalised hidden states `(batch, seq, d)` of token ids `(batch, seq)`."""
    heads, eps = o["n_head"], o.get("layer_norm_epsilon", 1e-5)

    def block(x: jax.Array, p: dict) -> tuple:
        q, k, v = _gpt2_qkv(p, x, heads, eps)
        return _gpt2_rest(p, x, attention(q, k, v, kind), eps), None

    x = params["wte"][ids] + params["wpe"][: ids.shape[1]]
    x, _ = jax.lax.scan(checkpointed(block, remat), x, params["blocks"])
    return layer_norm(x, params["lnf_g"], params["lnf_b"], eps)


def gpt2_loss(
    params: dict, ids: jax.Array, o: dict, kind: str, remat: Any
) -> jax.Array:
    hidden = gpt2_hidden(params, ids, o, kind, remat)
    return next_token_loss(hidden @ params["wte"].T, ids)


def next_token_loss(logits: jax.Array, ids: jax.Array) -> jax.Array:
    """Mean next-token cross entropy, the log-softmax in float32 (the whole logits
    held, as a hand-written step usually does)."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(F32), axis=-1)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()


# --------------------------------------------------------------------------- Llama


def llama_init(o: dict, key: jax.Array, dtype: Any) -> dict:
    d, layers, inner = o["hidden_size"], o["num_hidden_layers"], o["intermediate_size"]
    heads, kv = o["num_attention_heads"], o["num_key_value_heads"]
    hd = d // heads
    k = jax.random.split(key, 9)
    blocks = dict(
        in_norm=jnp.ones((layers, d), dtype),
        q_w=_normal(k[0], (layers, d, heads * hd), dtype),
        k_w=_normal(k[1], (layers, d, kv * hd), dtype),
        v_w=_normal(k[2], (layers, d, kv * hd), dtype),
        o_w=_normal(k[3], (layers, heads * hd, d), dtype),
        post_norm=jnp.ones((layers, d), dtype),
        gate_w=_normal(k[4], (layers, d, inner), dtype),
        up_w=_normal(k[5], (layers, d, inner), dtype),
        down_w=_normal(k[6], (layers, inner, d), dtype),
    )
    return dict(embed=_normal(k[7], (o["vocab_size"], d), dtype), blocks=blocks,
                norm=jnp.ones((d,), dtype),
                lm_head=_normal(k[8], (d, o["vocab_size"]), dtype))  # fmt: skip


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding ("rotate half") of `(batch, seq, heads, dim)` at positions
    0, 1, ..., computed in float32."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = theta ** (-np.arange(0, dim, 2, dtype=np.float32) / dim)
    angles = jnp.arange(seq, dtype=F32)[:, None] * freqs[None, :]
    cos = jnp.tile(jnp.cos(angles), (1, 2))[None, :, None, :]
    sin = jnp.tile(jnp.sin(angles), (1, 2))[None, :, None, :]
    wide = x.astype(F32)
    half = dim // 2
    rotated = jnp.concatenate([-wide[..., half:], wide[..., :half]], axis=-1)
    return (wide * cos + rotated * sin).astype(x.dtype)


def llama_hidden(
    params: dict, ids: jax.Array, o: dict, kind: str, remat: Any
) -> jax.Array:
    heads, kv = o["num_attention_heads"], o["num_key_value_heads"]
    eps, theta = o.get("rms_norm_eps", 1e-6), o.get("rope_theta", 10000.0)

    def block(x: jax.Array, p: dict) -> tuple:
        b, t, d = x.shape
        h = rms_norm(x, p["in_norm"], eps)
        q = rope((h @ p["q_w"]).reshape(b, t, heads, -1), theta)
        k = rope((h @ p["k_w"]).reshape(b, t, kv, -1), theta)
        v = (h @ p["v_w"]).reshape(b, t, kv, -1)
        x = x + attention(q, k, v, kind).reshape(b, t, -1) @ p["o_w"]
        h = rms_norm(x, p["post_norm"], eps)
        return x + (jax.nn.silu(h @ p["gate_w"]) * (h @ p["up_w"])) @ p["down_w"], None

    x = params["embed"][ids]
    x, _ = jax.lax.scan(checkpointed(block, remat), x, params["blocks"])
    return rms_norm(x, params["norm"], eps)


def llama_loss(
    params: dict, ids: jax.Array, o: dict, kind: str, remat: Any
) -> jax.Array:
    hidden = llama_hidden(params, ids, o, kind, remat)
    return next_token_loss(hidden @ params["lm_head"], ids)


# ------------------------------------------------------------------ training step


LOSSES = {"gpt2": gpt2_loss, "llama": llama_loss}
INITS = {"gpt2": gpt2_init, "llama": llama_init}


def train_step(name: str, o: dict, kind: str, remat: Any, optimiser: Any) -> Any:
    """`step(ids, params, state) -> (params, state, loss)` under `jax.jit`, the
    parameters and optimiser state donated."""
    loss = functools.partial(LOSSES[name], o=o, kind=kind, remat=remat)

    @functools.partial(jax.jit, donate_argnums=(1, 2))
    def step(ids: jax.Array, params: dict, state: Any) -> tuple:
        value, grads = jax.value_and_grad(loss)(params, ids)
        updates, state = optimiser.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return step


# --------------------------------------------------------------------- generation


def gpt2_generate(
    params: dict, prompt: jax.Array, new_tokens: int, o: dict
) -> jax.Array:
    """Greedy generation, `(batch, prompt + new_tokens)`: the prompt in one pass
    that fills a key/value cache `(layers, batch, length, heads, head_dim)`, then
    one cached step per new token in a `lax.scan` (each updating the cache in
    place, layer by layer). XLA attention throughout."""
    return _generate(params, prompt, new_tokens, o["n_head"],
                     o.get("layer_norm_epsilon", 1e-5))  # fmt: skip


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _generate(
    params: dict, prompt: jax.Array, new: int, heads: int, eps: float
) -> jax.Array:
    batch, n = prompt.shape
    blocks = params["blocks"]
    depth, d = blocks["ln1_g"].shape
    length = n + new
    shape = (depth, batch, length, heads, d // heads)
    dtype = params["wte"].dtype

    def logits_of_last(x: jax.Array) -> jax.Array:
        h = layer_norm(x[:, -1], params["lnf_g"], params["lnf_b"], eps)
        return jnp.argmax(h @ params["wte"].T, axis=-1).astype(prompt.dtype)

    def prefill(x: jax.Array, p: dict) -> tuple:
        q, k, v = _gpt2_qkv(p, x, heads, eps)
        return _gpt2_rest(p, x, attention(q, k, v, "xla"), eps), (k, v)

    x = params["wte"][prompt] + params["wpe"][:n]
    x, (ks, vs) = jax.lax.scan(prefill, x, blocks)
    cache = tuple(jnp.zeros(shape, dtype).at[:, :, :n].set(a) for a in (ks, vs))
    first = logits_of_last(x)

    def one_token(carry: tuple, _: Any) -> tuple:
        (keys, values), token, pos = carry
        x = params["wte"][token][:, None] + params["wpe"][pos][None, None]
        visible = (jnp.arange(length) <= pos)[None, None, None, :]

        def layer(inner: tuple, i: jax.Array) -> tuple:
            x, keys, values = inner
            p = jax.tree.map(lambda a: a[i], blocks)
            q, k, v = _gpt2_qkv(p, x, heads, eps)
            at = (i, 0, pos, 0, 0)
            keys = jax.lax.dynamic_update_slice(keys, k[None], at)
            values = jax.lax.dynamic_update_slice(values, v[None], at)
            a = jax.nn.dot_product_attention(q, keys[i], values[i], mask=visible,
                                             implementation="xla")  # fmt: skip
            return (_gpt2_rest(p, x, a, eps), keys, values), None

        (x, keys, values), _ = jax.lax.scan(layer, (x, keys, values), jnp.arange(depth))
        nxt = logits_of_last(x)
        return ((keys, values), nxt, pos + 1), nxt

    carry = (cache, first, jnp.asarray(n, jnp.int32))
    _, rest = jax.lax.scan(one_token, carry, None, length=new - 1)
    return jnp.concatenate([prompt, first[:, None], rest.T], axis=1)


def bandwidth_tokens_per_s(param_bytes: int, bandwidth: float, batch: int) -> float:
    """The ceiling of greedy decoding: every step reads every parameter once, so
    at most `bandwidth / param_bytes` steps a second (each `batch` tokens); the
    key/value cache's reads are left out."""
    return batch * bandwidth / max(param_bytes, 1)
