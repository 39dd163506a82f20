"""Multi-device cases for test_sharding.py, run in child processes (JAX fixes its
device count when it starts).

    python tests/_sharding_cases.py CASE [CASE ...]    # on 8 simulated CPU devices
    python tests/_sharding_cases.py worker I PORT OUT   # process I of 2, 4 devices

Each case prints `case NAME: OK`, or `case NAME: FAILED` and its traceback; the
child prints `OK` at the end.
Importing this module does nothing (the test session imports it for `build` and
`train`, which compute the single-device reference).
"""

from __future__ import annotations

import functools
import sys

STEPS = 3
BATCH, SEQ, SIZE = 16, 4, 16


def build():
    """The model (attention then an MLP), an adam optimiser and a batch. Arrays
    come from NumPy (the same in every process; no PRNG kernels to compile)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import boxwood as bw

    class Net(bw.Module):
        attn: bw.nn.MultiheadAttention
        mlp: bw.nn.MLP

        def __call__(self, x):
            h = x + self.attn(x, x, x)
            return jax.vmap(self.mlp)(h)

    def net(key):
        k1, k2 = jax.random.split(key)
        return Net(
            bw.nn.MultiheadAttention(4, SIZE, key=k1),
            bw.nn.MLP(SIZE, SIZE, 32, depth=2, activation=jnp.tanh, key=k2),
        )

    rng = np.random.default_rng(0)

    def fill(leaf):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        return jnp.asarray(0.3 * rng.standard_normal(leaf.shape), leaf.dtype)

    abstract = bw.filter_eval_shape(net, jax.random.key(0))
    model = jax.tree_util.tree_map(fill, abstract)
    x, y = (jnp.asarray(rng.standard_normal((BATCH, SEQ, SIZE)), jnp.float32)
            for _ in range(2))  # fmt: skip
    return model, optax.adam(1e-2), x, y


def make_step(tx, shardings=None):
    """A training step; with `shardings` (a tree for `(model, opt_state)`), the
    new model and state are constrained to it so they keep their sharding."""
    import jax
    import jax.numpy as jnp

    import boxwood as bw

    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    @bw.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = bw.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state)
        model = bw.apply_updates(model, updates)
        if shardings is not None:
            model, opt_state = bw.filter_shard((model, opt_state), shardings)
        return model, opt_state, loss

    return step


def train(model, opt_state, x, y, step):
    losses = []
    for _ in range(STEPS):
        model, opt_state, loss = step(model, opt_state, x, y)
        losses.append(loss)
    return model, opt_state, losses


def host_leaves(tree):
    """Every array leaf as NumPy (from this process's first shard when the array
    is replicated across processes)."""
    import jax
    import numpy as np

    import boxwood as bw

    def get(a):
        if a.is_fully_addressable:
            return np.asarray(a)
        assert a.sharding.is_fully_replicated, a.sharding
        return np.asarray(a.addressable_data(0))

    return [get(a) for a in jax.tree_util.tree_leaves(bw.filter(tree, bw.is_array))]


@functools.cache
def reference():
    """Losses and parameters of the single-device run (computed once per process)."""
    model, tx, x, y = build()
    model, _, losses = train(model, tx.init(model), x, y, make_step(tx))
    return [float(v) for v in losses], host_leaves(model)


def reference_on_cpu():
    """`reference()` run on the CPU platform, which the two-process workers use
    (`JAX_PLATFORMS=cpu`), whatever this process's default backend: a GPU's
    float32 results differ from the CPU's in their last bits, and more at its
    default matmul precision."""
    import jax

    with jax.numpy_dtype_promotion("standard"):  # optax's adam mixes int and float
        if jax.default_backend() == "cpu":
            return reference()  # cached: shared with the in-process cases
        with jax.default_device(jax.devices("cpu")[0]):
            return reference.__wrapped__()


def _sharded_run(mesh, rules, batch_axis):
    import boxwood as bw

    model, tx, x, y = build()
    opt_state = bw.filter_jit(tx.init)(model)  # one compilation for every leaf
    model, opt_state = bw.shard((model, opt_state), mesh, rules)
    shardings = bw.named_shardings((model, opt_state), mesh, rules)
    x, y = bw.shard_batch((x, y), mesh, batch_axis)
    step = make_step(tx, shardings)
    model, opt_state, losses = train(model, opt_state, x, y, step)
    return model, opt_state, [float(v) for v in losses], shardings


def _compare(model, losses):
    import numpy as np

    ref_losses, ref_leaves = reference()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-5)
    for got, want in zip(host_leaves(model), ref_leaves, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _shard_shapes(array) -> set:
    return {s.data.shape for s in array.addressable_shards}


def _kept(tree, shardings) -> None:
    """Every array of `tree` still has the sharding it was placed with."""
    import jax

    import boxwood as bw

    arrays = jax.tree_util.tree_leaves(bw.filter(tree, bw.is_array))
    wanted = jax.tree_util.tree_leaves(shardings)
    assert len(arrays) == len(wanted)
    for a, s in zip(arrays, wanted):
        assert a.sharding.is_equivalent_to(s, a.ndim), (a.sharding, s)


def case_data_parallel():

    import boxwood as bw

    mesh = bw.make_mesh((8,), ("data",))
    model, opt_state, losses, shardings = _sharded_run(mesh, bw.data_parallel(), "data")
    _compare(model, losses)
    assert _shard_shapes(model.mlp.layers[1].weight) == {(32, 32)}  # replicated
    assert len(model.mlp.layers[1].weight.addressable_shards) == 8
    _kept((model, opt_state), shardings)


def case_fsdp():

    import boxwood as bw

    mesh = bw.make_mesh((8,), ("data",))
    model, opt_state, losses, shardings = _sharded_run(
        mesh, bw.fsdp(min_size=64), "data"
    )
    _compare(model, losses)
    assert _shard_shapes(model.mlp.layers[1].weight) == {(4, 32)}
    assert _shard_shapes(model.mlp.layers[0].weight) == {(4, 16)}  # (32, 16)
    assert _shard_shapes(model.attn.query_proj.weight) == {(2, 16)}
    assert _shard_shapes(model.mlp.layers[0].bias) == {(32,)}  # below min_size
    assert _shard_shapes(opt_state[0].mu.mlp.layers[1].weight) == {(4, 32)}
    _kept((model, opt_state), shardings)


def case_tensor_parallel():

    import boxwood as bw

    mesh = bw.make_mesh((2, 4), ("data", "model"))
    model, tx, _, _ = build()
    rules = bw.tensor_parallel(model, "model")
    model, opt_state, losses, shardings = _sharded_run(mesh, rules, "data")
    _compare(model, losses)
    assert _shard_shapes(model.mlp.layers[0].weight) == {(8, 16)}  # column
    assert _shard_shapes(model.mlp.layers[0].bias) == {(8,)}
    assert _shard_shapes(model.mlp.layers[1].weight) == {(32, 8)}  # row
    assert _shard_shapes(model.mlp.layers[1].bias) == {(32,)}
    assert _shard_shapes(model.attn.query_proj.weight) == {(4, 16)}  # heads
    assert _shard_shapes(model.attn.output_proj.weight) == {(16, 4)}
    assert _shard_shapes(opt_state[0].nu.attn.key_proj.weight) == {(4, 16)}
    _kept((model, opt_state), shardings)


def case_errors():
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import boxwood as bw

    mesh = bw.make_mesh((8,), ("data",))
    tree = {"w": jnp.ones((4, 16))}
    for rules, text in [
        ([("w", P("data"))], "dimension 0 (size 4) is not divisible by 8"),
        ([("w", P(None, "model"))], "mesh axis 'model' is not in the mesh"),
    ]:
        try:
            bw.shard(tree, mesh, rules)
        except ValueError as error:
            assert "leaf `w` of shape (4, 16)" in str(error), error
            assert text in str(error), error
        else:
            raise AssertionError(f"no error for {rules}")
    try:
        bw.shard_batch({"x": jnp.ones((12, 3))}, mesh)
    except ValueError as error:
        assert "`batch.x` of shape (12, 3): the batch size 12" in str(error), error
    else:
        raise AssertionError("no error for a batch of 12 on 8 devices")


def case_jit_shardings():
    """`filter_jit(in_shardings=..., out_shardings=...)` as pytree prefixes, with
    donation: outputs keep their shardings step after step, buffers are reused."""
    import warnings

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    import boxwood as bw

    warnings.simplefilter("error")  # a donated buffer that is not reused warns
    mesh = bw.make_mesh((8,), ("data",))
    rules = bw.fsdp(min_size=64)
    model, tx, x, y = build()
    opt_state = bw.filter_jit(tx.init)(model)
    model_sh, opt_sh = bw.named_shardings((model, opt_state), mesh, rules)
    batch_sh = NamedSharding(mesh, PartitionSpec("data"))

    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    @bw.filter_jit(
        donate="warn-except-first",
        in_shardings=(batch_sh, model_sh, opt_sh),
        out_shardings=(model_sh, opt_sh, None),
    )
    def step(batch, model, opt_state):
        loss, grads = bw.filter_value_and_grad(loss_fn)(model, *batch)
        updates, opt_state = tx.update(grads, opt_state)
        return bw.apply_updates(model, updates), opt_state, loss

    model, opt_state = bw.shard((model, opt_state), mesh, rules)
    batch = bw.shard_batch((x, y), mesh)
    losses = []
    for _ in range(STEPS):
        old = model.mlp.layers[1].weight
        model, opt_state, loss = step(batch, model, opt_state)
        losses.append(float(loss))
        assert old.is_deleted()  # donated, and its buffer reused
        _kept((model, opt_state), (model_sh, opt_sh))
    assert step.cache_info().traces == 1
    assert _shard_shapes(model.mlp.layers[1].weight) == {(4, 32)}
    _compare(model, losses)

    # prefixes decide placements that propagation alone would not choose
    @bw.filter_jit(out_shardings={"a": batch_sh, "b": None})
    def double(tree):
        return {"a": tree["a"] * 2, "b": tree["b"]}

    out = double({"a": jnp.ones((8, 4)), "b": "label"})
    assert out["b"] == "label" and _shard_shapes(out["a"]) == {(1, 4)}

    @bw.filter_jit(in_shardings=({"a": batch_sh, "b": None}, None))
    def add(tree, scale):
        return tree["a"] + scale

    out = add({"a": jnp.ones((8, 4)), "b": "label"}, jnp.ones(4))
    assert _shard_shapes(out) == {(1, 4)}


def worker(process_id: int, port: int, out: str) -> None:
    """One of two processes: 4 CPU devices each, one 8-device mesh, DP training."""
    import jax

    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=60,
    )
    import numpy as np

    import boxwood as bw

    assert jax.device_count() == 8 and jax.local_device_count() == 4
    mesh = bw.make_mesh((8,), ("data",))
    model, _, losses, _ = _sharded_run(mesh, bw.data_parallel(), "data")
    arrays = {f"leaf{i}": a for i, a in enumerate(host_leaves(model))}
    np.savez(out, losses=np.asarray(losses), **arrays)
    jax.distributed.shutdown()


def run_cases(names: list[str]) -> None:
    """Run the cases in this one process (one JAX start, one reference run), each
    reported as `case NAME: OK` or `case NAME: FAILED` with its traceback."""
    import traceback

    for name in names:
        try:
            globals()[f"case_{name}"]()
        except Exception:
            print(f"case {name}: FAILED\n{traceback.format_exc()}", flush=True)
        else:
            print(f"case {name}: OK", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        run_cases(sys.argv[1:])
    print("OK")
