"""GPT-2 in Flax NNX, as an NNX user writes it, for `benchmarks/accelerator.py`:
`nnx.Module`s of `nnx.Linear`, `nnx.LayerNorm` and `nnx.Embed` (bfloat16
parameters and computation), the blocks in an `nnx.List` applied in a Python loop,
each block under `nnx.remat` with the run's policy; the attention kernel of
`_acc_attention`; the loss from the whole logits (log-softmax in float32);
`nnx.Optimizer` with optax AdamW and an `nnx.jit` step (model and optimiser
donated)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from _acc_attention import attention
from _acc_jax import next_token_loss

_INIT = nnx.initializers.normal(0.02)


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, kind: str, dtype: Any, rngs: nnx.Rngs):
        def dense(n_in: int, n_out: int) -> nnx.Linear:
            return nnx.Linear(n_in, n_out, dtype=dtype, param_dtype=dtype,
                              kernel_init=_INIT, rngs=rngs)  # fmt: skip

        def norm() -> nnx.LayerNorm:
            return nnx.LayerNorm(
                d, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs
            )

        self.ln_1, self.c_attn, self.c_proj = norm(), dense(d, 3 * d), dense(d, d)
        self.ln_2, self.c_fc, self.mlp_proj = norm(), dense(d, 4 * d), dense(4 * d, d)
        self.heads, self.kind = heads, kind

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        qkv = self.c_attn(self.ln_1(x)).reshape(b, t, 3, self.heads, d // self.heads)
        a = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], self.kind)
        x = x + self.c_proj(a.reshape(b, t, d))
        return x + self.mlp_proj(jax.nn.gelu(self.c_fc(self.ln_2(x)), approximate=True))


def _call_block(block: Block, x: jax.Array) -> jax.Array:
    return block(x)


class GPT2(nnx.Module):
    def __init__(self, o: dict, kind: str, remat: Any, dtype: Any, rngs: nnx.Rngs):
        d = o["n_embd"]
        embed = dict(dtype=dtype, param_dtype=dtype, embedding_init=_INIT, rngs=rngs)
        self.wte = nnx.Embed(o["vocab_size"], d, **embed)
        self.wpe = nnx.Embed(o["n_positions"], d, **embed)
        self.h = nnx.List(
            [Block(d, o["n_head"], kind, dtype, rngs) for _ in range(o["n_layer"])]
        )
        self.ln_f = nnx.LayerNorm(
            d, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs
        )
        self.remat = remat

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.wte(ids) + self.wpe(jnp.arange(ids.shape[1]))
        call = _call_block
        if self.remat == "full":
            call = nnx.remat(_call_block)
        elif self.remat not in (None, "none"):
            policy = getattr(jax.checkpoint_policies, self.remat)
            call = nnx.remat(_call_block, policy=policy)
        for block in self.h:
            x = call(block, x)
        return self.wte.attend(self.ln_f(x))


def build(o: dict, kind: str, remat: Any, dtype: Any, seed: int = 0) -> GPT2:
    return GPT2(o, kind, remat, dtype, nnx.Rngs(seed))


def trainer(model: GPT2, lr: float = 3e-4) -> tuple[Any, Any]:
    """`(step, optimiser)`: `step(model, optimiser, ids) -> loss` updates both in
    place."""
    optimiser = nnx.Optimizer(model, optax.adamw(lr, weight_decay=0.1), wrt=nnx.Param)

    @nnx.jit(donate_argnums=(0, 1))
    def step(model: GPT2, optimiser: nnx.Optimizer, ids: jax.Array) -> jax.Array:
        def loss_fn(model: GPT2) -> jax.Array:
            return next_token_loss(model(ids), ids)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimiser.update(model, grads)
        return loss

    return step, optimiser
