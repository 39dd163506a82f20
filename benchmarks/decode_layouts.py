"""Which key/value cache layout makes GPT-2's one-token decoding step fastest on
the device: the same greedy loop (128 steps over a cache of 160 slots, layers
unrolled with static indices, as boxwood's decode step runs them) with the
cache held five ways, side by side in one process:

- `bthd`: `(depth, batch, length, heads, head_dim)`, as boxwood and the
  hand-written loop hold it today;
- `bhtd`: `(depth, batch, heads, length, head_dim)`;
- `flat`: `(depth, batch, length, heads * head_dim)`;
- `grouped`: `(depth, batch, heads / g, length, g * head_dim)` with `g = 128 /
  head_dim` heads side by side in one 128-wide row (GPT-2's 64-wide heads in
  pairs), attended with a block-diagonal query so that no product reads a
  padded lane.

Each is timed (median of `--reps` calls, each `--steps` steps) and checked to
give the same tokens as `bthd`. A TPU tiles an array's two minor dimensions by
(8, 128) 32-bit words, so a 64-wide minor dimension is stored padded to 128:
the layouts differ in the bytes a step reads, not in the values.

    python benchmarks/decode_layouts.py            # GPT-2-small, batch 1 and 32
    python benchmarks/decode_layouts.py --quick    # tiny sizes (a CPU check)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import _acc_boxwood  # noqa: E402
import _acc_cases as cases  # noqa: E402
from _acc_jax import _gpt2_qkv, _gpt2_rest, from_boxwood_gpt2, layer_norm  # noqa: E402

LAYOUTS = ("bthd", "bhtd", "flat", "grouped")
# (layout, where the layers' weights are sliced): the contenders, in order
VARIANTS = (
    ("bthd", "hoisted"),
    ("bthd", "inside"),
    ("grouped", "hoisted"),
    ("grouped", "inside"),
    ("bhtd", "inside"),
)
F32 = jnp.float32


def _shape(layout: str, depth: int, b: int, t: int, h: int, d: int) -> tuple:
    g = 128 // d if 128 % d == 0 and h % (128 // d) == 0 else 1
    return {
        "bthd": (depth, b, t, h, d),
        "bhtd": (depth, b, h, t, d),
        "flat": (depth, b, t, h * d),
        "grouped": (depth, b, h // g, t, g * d),
    }[layout]


def _write(
    layout: str, cache: jax.Array, new: jax.Array, i: int, pos: Any
) -> jax.Array:
    """`new` `(b, h, d)` written at slot `pos` of layer `i`."""
    b, h, d = new.shape
    zero = jnp.int32(0)
    if layout == "bthd":
        return jax.lax.dynamic_update_slice(
            cache, new[None, :, None], (i, zero, pos, zero, zero)
        )
    if layout == "bhtd":
        return jax.lax.dynamic_update_slice(
            cache, new[None, :, :, None], (i, zero, zero, pos, zero)
        )
    if layout == "flat":
        return jax.lax.dynamic_update_slice(
            cache, new.reshape(1, b, 1, h * d), (i, zero, pos, zero)
        )
    groups, width = cache.shape[2], cache.shape[4]
    row = new.reshape(1, b, groups, 1, width)
    return jax.lax.dynamic_update_slice(cache, row, (i, zero, zero, pos, zero))


def _attend(
    layout: str, q: jax.Array, keys: jax.Array, values: jax.Array, visible: jax.Array
) -> jax.Array:
    """`q` `(b, h, d)` over one layer's cache; `visible` `(t,)`."""
    b, h, d = q.shape
    scale = 1.0 / np.sqrt(d)
    if layout == "grouped":
        groups, t, width = keys.shape[1:]
        g = width // d
        eye = jnp.eye(g, dtype=q.dtype)  # query i of a group fills its own lanes
        qg = (q.reshape(b, groups, g, 1, d) * eye[None, None, :, :, None]).reshape(
            b, groups, g, width
        )
        s = jnp.einsum("bpie,bpte->bpit", qg, keys, preferred_element_type=F32) * scale
        s = jnp.where(visible, s, -1e30)
        w = jax.nn.softmax(s, axis=-1).astype(values.dtype)
        out = jnp.einsum("bpit,bpte->bpie", w, values, preferred_element_type=F32)
        out = (out.reshape(b, groups, g, g, d) * eye[None, None, :, :, None]).sum(3)
        return out.reshape(b, h, d).astype(q.dtype)
    if layout == "bthd":
        k, v, spec = keys, values, "bthd"
    elif layout == "bhtd":
        k, v, spec = keys, values, "bhtd"
    else:
        t = keys.shape[1]
        k, v, spec = keys.reshape(b, t, h, d), values.reshape(b, t, h, d), "bthd"
    s = jnp.einsum(f"bhd,{spec}->bht", q, k, preferred_element_type=F32) * scale
    s = jnp.where(visible, s, -1e30)
    w = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum(f"bht,{spec}->bhd", w, v, preferred_element_type=F32).astype(
        q.dtype
    )


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7))
def decode(
    params: dict,
    first: jax.Array,
    start: jax.Array,
    length: int,
    steps: int,
    heads: int,
    layout: str,
    where: str = "hoisted",
) -> jax.Array:
    """`steps` greedy tokens after `first` `(b,)` from slot `start`, over an empty
    cache of `length` slots (the prompt's keys are left zero: the step's cost,
    not its values, is measured)."""
    blocks = params["blocks"]
    depth, dm = blocks["ln1_g"].shape
    b, d = first.shape[0], dm // heads
    shape = _shape(layout, depth, b, length, heads, d)
    hoisted = [jax.tree.map(lambda a, i=i: a[i], blocks) for i in range(depth)]

    def step(carry: tuple, _: Any) -> tuple:
        keys, values, token, pos = carry
        layer_params = hoisted
        if where == "inside":  # sliced in the loop's body (static indices)
            layer_params = [
                jax.tree.map(lambda a, i=i: a[i], blocks) for i in range(depth)
            ]
        x = params["wte"][token][:, None] + params["wpe"][pos][None, None]
        visible = jnp.arange(length) <= pos
        for i, p in enumerate(layer_params):
            q, k, v = _gpt2_qkv(p, x, heads, 1e-5)
            keys = _write(layout, keys, k[:, 0], i, pos)
            values = _write(layout, values, v[:, 0], i, pos)
            a = _attend(layout, q[:, 0], keys[i], values[i], visible)
            x = _gpt2_rest(p, x, a[:, None], 1e-5)
        h = layer_norm(x[:, 0], params["lnf_g"], params["lnf_b"], 1e-5)
        nxt = jnp.argmax(h @ params["wte"].T, axis=-1).astype(token.dtype)
        return (keys, values, nxt, pos + 1), nxt

    cache = (
        jnp.zeros(shape, params["wte"].dtype),
        jnp.zeros(shape, params["wte"].dtype),
    )
    _, out = jax.lax.scan(step, (*cache, first, start), None, length=steps)
    return out.T


def _tokens(*args: Any) -> np.ndarray:
    return np.asarray(decode(*args))


def boxwood_steps(batch: int, case: Any, steps: int, reps: int) -> list[dict]:
    """boxwood's own decode step (`model.decode` through `generate`'s
    `stepper`) in the same greedy `lax.scan`, and `generate` itself, timed the
    same way: what the model's step costs apart from the loop around it."""
    import boxwood.models as bm
    from boxwood.models._generate_loop import stepper

    model = _acc_boxwood.generation_model(case.options)
    length = case.prompt + steps
    first = jnp.asarray(np.arange(batch, dtype=np.int32))

    @jax.jit
    def loop(model: Any, first: jax.Array) -> jax.Array:
        step, state = stepper(model, None, batch, model.init_cache(length))

        def body(carry: tuple, _: Any) -> tuple:
            state, token, pos = carry
            logits, state = step(token[:, None], state, pos)
            nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
            return (state, nxt, pos + 1), nxt

        _, out = jax.lax.scan(
            body, (state, first, jnp.int32(case.prompt)), None, length=steps
        )
        return out.T

    prompt = jnp.asarray(
        np.arange(batch * case.prompt, dtype=np.int32).reshape(batch, case.prompt)
        % 1000
    )
    rows = []
    for what, run in (("boxwood decode step", lambda: np.asarray(loop(model, first))),
                      ("boxwood generate", lambda: np.asarray(bm.generate(model, prompt, steps)))):  # fmt: skip
        run()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        per_step = statistics.median(times) / steps
        rows.append({"batch": batch, "layout": what, "weights": "-", "step_ms": 1e3 * per_step,
                     "tokens_per_s": batch / per_step, "same_tokens_as_bthd": None})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--boxwood-only", action="store_true",
                   help="only boxwood's decode step and generate")  # fmt: skip
    args = p.parse_args()
    case = cases.generate_case(args.quick)
    model = _acc_boxwood.generation_model(case.options)
    params = from_boxwood_gpt2(model)
    del model
    heads, steps = case.options["n_head"], case.new_tokens
    length = case.prompt + case.new_tokens
    rows = []
    for batch in case.batches:
        first = jnp.asarray(
            np.arange(batch, dtype=np.int32) % case.options["vocab_size"]
        )
        start = jnp.int32(case.prompt)
        reference = None
        for layout, where in () if args.boxwood_only else VARIANTS:
            run = functools.partial(
                _tokens, params, first, start, length, steps, heads, layout, where
            )
            tokens = run()
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            per_step = statistics.median(times) / steps
            reference = tokens if reference is None else reference
            rows.append({"batch": batch, "layout": layout, "weights": where, "step_ms": 1e3 * per_step,
                         "tokens_per_s": batch / per_step,
                         "same_tokens_as_bthd": bool((tokens == reference).all())})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        rows += boxwood_steps(batch, case, steps, args.reps)
    text = [
        "| batch | layout | weights sliced | step ms | tokens/s | tokens as the first |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        text.append(f"| {r['batch']} | `{r['layout']}` | {r['weights']} | {r['step_ms']:.3f} | "
                    f"{r['tokens_per_s']:,.0f} | {r['same_tokens_as_bthd']} |")  # fmt: skip
    print("\n".join(text))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
        (args.out / "decode_layouts.json").write_text(
            json.dumps({"meta": meta, "rows": rows}, indent=1)
        )
        (args.out / "decode_layouts.md").write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
