"""GPT-2 in Equinox, as an Equinox user writes it, for `benchmarks/accelerator.py`:
`eqx.Module`s of `eqx.nn.Linear` and `eqx.nn.LayerNorm` acting on one sequence
(`jax.vmap` over the batch), bfloat16 parameters; the blocks built stacked with
`eqx.filter_vmap` and applied with `lax.scan` over their arrays (Equinox's
documented scan-over-layers), under `jax.checkpoint` with the run's policy; the
attention kernel of `_acc_attention`; the loss from the whole logits
(log-softmax in float32); `eqx.filter_jit` + `eqx.filter_value_and_grad`, optax
AdamW, model and optimiser state donated."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from _acc_attention import attention
from _acc_jax import checkpointed, next_token_loss


class Block(eqx.Module):
    ln_1: eqx.nn.LayerNorm
    c_attn: eqx.nn.Linear
    c_proj: eqx.nn.Linear
    ln_2: eqx.nn.LayerNorm
    c_fc: eqx.nn.Linear
    mlp_proj: eqx.nn.Linear
    heads: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)

    def __init__(self, d: int, heads: int, kind: str, dtype: Any, key: jax.Array):
        k = jax.random.split(key, 4)
        self.ln_1 = eqx.nn.LayerNorm(d, eps=1e-5, dtype=dtype)
        self.c_attn = eqx.nn.Linear(d, 3 * d, dtype=dtype, key=k[0])
        self.c_proj = eqx.nn.Linear(d, d, dtype=dtype, key=k[1])
        self.ln_2 = eqx.nn.LayerNorm(d, eps=1e-5, dtype=dtype)
        self.c_fc = eqx.nn.Linear(d, 4 * d, dtype=dtype, key=k[2])
        self.mlp_proj = eqx.nn.Linear(4 * d, d, dtype=dtype, key=k[3])
        self.heads, self.kind = heads, kind

    def __call__(self, x: jax.Array) -> jax.Array:
        t, d = x.shape
        qkv = jax.vmap(self.c_attn)(jax.vmap(self.ln_1)(x))
        q, k, v = (
            qkv.reshape(t, 3, self.heads, d // self.heads)[:, i][None] for i in range(3)
        )
        x = x + jax.vmap(self.c_proj)(attention(q, k, v, self.kind)[0].reshape(t, d))
        h = jax.nn.gelu(jax.vmap(self.c_fc)(jax.vmap(self.ln_2)(x)), approximate=True)
        return x + jax.vmap(self.mlp_proj)(h)


class GPT2(eqx.Module):
    wte: eqx.nn.Embedding
    wpe: eqx.nn.Embedding
    blocks: Block  # stacked: every array has a leading layer axis
    ln_f: eqx.nn.LayerNorm
    remat: Any = eqx.field(static=True)

    def __init__(self, o: dict, kind: str, remat: Any, dtype: Any, key: jax.Array):
        d = o["n_embd"]
        k1, k2, k3 = jax.random.split(key, 3)
        self.wte = eqx.nn.Embedding(o["vocab_size"], d, dtype=dtype, key=k1)
        self.wpe = eqx.nn.Embedding(o["n_positions"], d, dtype=dtype, key=k2)
        keys = jax.random.split(k3, o["n_layer"])
        self.blocks = eqx.filter_vmap(lambda k: Block(d, o["n_head"], kind, dtype, k))(
            keys
        )
        self.ln_f = eqx.nn.LayerNorm(d, eps=1e-5, dtype=dtype)
        self.remat = remat

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.wte.weight[ids] + self.wpe.weight[jnp.arange(ids.shape[0])]
        dynamic, static = eqx.partition(self.blocks, eqx.is_array)

        def layer(x: jax.Array, arrays: Any) -> tuple:
            return eqx.combine(arrays, static)(x), None

        x, _ = jax.lax.scan(checkpointed(layer, self.remat), x, dynamic)
        return jax.vmap(self.ln_f)(x) @ self.wte.weight.T


def build(o: dict, kind: str, remat: Any, dtype: Any, seed: int = 0) -> GPT2:
    return GPT2(o, kind, remat, dtype, jax.random.key(seed))


def loss(model: GPT2, ids: jax.Array) -> jax.Array:
    return next_token_loss(jax.vmap(model)(ids), ids)


def trainer(model: GPT2, lr: float = 3e-4) -> tuple[Any, Any]:
    """`(step, state)`: `step(ids, model, state) -> (model, state, loss)`."""
    optimiser = optax.adamw(lr, weight_decay=0.1)

    @eqx.filter_jit(donate="all-except-first")
    def step(ids: jax.Array, model: GPT2, state: Any) -> tuple:
        value, grads = eqx.filter_value_and_grad(loss)(model, ids)
        updates, state = optimiser.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, value

    return step, optimiser.init(eqx.filter(model, eqx.is_array))
