"""One cold-start measurement in a fresh process (run by bench_cold_start.py).

    python benchmarks/_cold_child.py LIB CASE [--cache DIR]

LIB is `boxwood` or `equinox`; CASE one of CASES. Prints one JSON line: seconds for
`import`, `build` (the constructor, arrays ready), `step` (the first training step:
trace, compile, run) and `total` (from the top of this script), plus JAX's own
`trace`, `lower` and `compile` durations summed over the whole process (from
`jax.monitoring`, the same events for both libraries).
"""

from __future__ import annotations

import time

START = time.perf_counter()

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
CASES = (
    "mlp",
    "mlp_lecun",
    "mlp_reinit_lecun",
    "mlp_reinit_orthogonal",
    "cnn",
    "transformer",
    "transformer_jax_split",
    "keys",
    "gru",
    "lstm",
    "step_list",
    "step_stacked",
)
D_MODEL, HEADS, BLOCKS, SEQ, BATCH = 128, 4, 12, 16, 4


def _import(lib: str):
    import jax

    totals = dict.fromkeys(_EVENTS.values(), 0.0)

    def listen(event: str, duration: float, **kwargs) -> None:
        if event in _EVENTS:
            totals[_EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    if lib == "boxwood":
        try:
            import boxwood as mod
        except ImportError:  # not installed: the source tree
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
            import boxwood as mod
    else:
        import equinox as mod
    import optax  # noqa: F401

    return mod, totals


def _block_class(lib):
    nn = lib.nn

    class Block(lib.Module):
        norm1: nn.LayerNorm
        attn: nn.MultiheadAttention
        norm2: nn.LayerNorm
        mlp: nn.MLP

        def __init__(self, key):
            k1, k2 = _split(key)
            self.norm1 = nn.LayerNorm(D_MODEL)
            self.attn = nn.MultiheadAttention(HEADS, D_MODEL, key=k1)
            self.norm2 = nn.LayerNorm(D_MODEL)
            self.mlp = nn.MLP(D_MODEL, D_MODEL, 4 * D_MODEL, 1, key=k2)

        def __call__(self, x):
            import jax

            h = jax.vmap(self.norm1)(x)
            x = x + self.attn(h, h, h)
            return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))

    return Block


#: How the model code splits its keys: each library's own idiom (boxwood:
#: `bw.random.split_keys`, computed on the host; equinox: `jax.random.split`). Case
#: `transformer_jax_split` runs boxwood's models with `jax.random.split` too.
_SPLITTER: list = []


def _split(key, n=2):
    return tuple(_SPLITTER[0](key, n))


def _reinit(lib, model, name: str, key):
    """Re-initialise the MLP's weights: `nn.init` in boxwood, the `tree_at` idiom
    Equinox documents (one initialiser call per weight) in equinox."""
    import jax

    inits = jax.nn.initializers
    fn = inits.lecun_normal() if name == "lecun" else inits.orthogonal()
    where = lambda m: [layer.weight for layer in m.layers]
    if hasattr(lib.nn, "init"):
        return lib.nn.init(model, where, fn, key=key)
    keys = jax.random.split(key, len(model.layers))
    new = [fn(k, w.shape[::-1], w.dtype).T for k, w in zip(keys, where(model))]
    return lib.tree_at(where, model, new)


def _lecun_layers(lib, key):
    """The MLP's nine `Linear` layers with `lecun_normal` weights from the start:
    boxwood's `weight_init=`; equinox has no such keyword, so its layers are built
    and their weights replaced with `tree_at`, as its documentation shows."""
    import jax

    sizes = [64] + [256] * 8 + [10]
    keys = _split(key, len(sizes) - 1)
    fn = jax.nn.initializers.lecun_normal()
    if hasattr(lib.nn, "init"):
        return [lib.nn.Linear(i, o, weight_init=fn, key=k)
                for i, o, k in zip(sizes, sizes[1:], keys)]  # fmt: skip
    layers = [lib.nn.Linear(i, o, key=k) for i, o, k in zip(sizes, sizes[1:], keys)]
    where = lambda ls: [layer.weight for layer in ls]
    new = [fn(k, w.shape[::-1], w.dtype).T for k, w in zip(keys, where(layers))]
    return lib.tree_at(where, layers, new)


def _build(lib, case: str, key):
    nn = lib.nn
    if case == "mlp":
        return nn.MLP(64, 10, 256, 8, key=key)
    if case == "mlp_lecun":
        return _lecun_layers(lib, key)
    if case.startswith("mlp_reinit_"):
        model = nn.MLP(64, 10, 256, 8, key=key)
        return _reinit(lib, model, case.rsplit("_", 1)[1], key)
    if case == "gru":
        return nn.GRUCell(64, 256, key=key)
    if case == "lstm":
        return nn.LSTMCell(64, 256, key=key)
    if case == "cnn":
        keys = _split(key, 5)
        convs = [nn.Conv2d(c_in, c_out, 3, padding=1, key=k)
                 for c_in, c_out, k in zip((3, 16, 32, 64), (16, 32, 64, 64), keys)]  # fmt: skip
        norms = [nn.BatchNorm(c, axis_name="batch") for c in (16, 32, 64, 64)]
        return convs, norms, nn.Linear(64, 10, key=keys[4])
    if case == "keys":  # the transformer's own key splitting, without the layers
        return [_split(k) for k in _split(key, BLOCKS)]
    block = _block_class(lib)
    if case == "transformer_jax_split":
        case = "transformer"
    if case == "step_stacked":
        return nn.Stacked(block, BLOCKS, key=key)
    return [block(k) for k in _split(key, BLOCKS)]


def _first_step(lib, model, stacked: bool) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    def apply(model, x):
        if stacked:
            return model(x)
        for block in model:
            x = block(x)
        return x

    def loss(model, x):
        return jnp.mean(jax.vmap(lambda xi: apply(model, xi))(x) ** 2)

    optimiser = optax.adam(1e-3)
    state = optimiser.init(lib.filter(model, lib.is_array))

    @lib.filter_jit
    def step(model, state, x):
        value, grads = lib.filter_value_and_grad(loss)(model, x)
        updates, state = optimiser.update(grads, state, model)
        return lib.apply_updates(model, updates), state, value

    x = jnp.ones((BATCH, SEQ, D_MODEL), jnp.float32)
    jax.block_until_ready(step(model, state, x))


def main(argv: list[str]) -> None:
    lib_name, case = argv[0], argv[1]
    cache = argv[argv.index("--cache") + 1] if "--cache" in argv else None
    lib, totals = _import(lib_name)
    import jax

    if cache is not None:
        lib.enable_compilation_cache(cache)
    own = lib_name == "boxwood" and case != "transformer_jax_split"
    _SPLITTER.append(lib.random.split_keys if own else jax.random.split)
    key = jax.random.key(0)
    jax.block_until_ready(key)
    after_import = time.perf_counter()
    model = _build(lib, case, key)
    jax.block_until_ready(model)
    after_build = time.perf_counter()
    if case.startswith("step"):
        _first_step(lib, model, stacked=case == "step_stacked")
    end = time.perf_counter()
    out = {
        "import": after_import - START,
        "build": after_build - after_import,
        "step": end - after_build,
        "total": end - START,
        **totals,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
