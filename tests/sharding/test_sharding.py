"""boxwood._sharding: rules, plans, strategies, and training on 8 simulated devices
and on two real processes (those run in child processes; see _sharding_cases.py)."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import boxwood as bw
from _child_flags import child_env, localhost_port, xla_flags_with_devices

CASES = pathlib.Path(__file__).parents[1] / "_sharding_cases.py"
SRC = str(pathlib.Path(bw.__file__).resolve().parents[1])
MESH8 = AbstractMesh((8,), ("data",))
MESH24 = AbstractMesh((2, 4), ("data", "model"))


def _child_env(**extra: str | None) -> dict:
    env = child_env(**extra)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ------------------------------------------------------------- 8 simulated devices
SIMULATED_CASES = [
    "data_parallel",
    "fsdp",
    "tensor_parallel",
    "jit_shardings",
    "errors",
]


def test_on_8_simulated_devices():
    """Each strategy's training steps equal the single-device run (1e-5), its
    parameters are really split, and outputs keep their shardings. The cases run
    in one child process (one JAX start with 8 devices, one reference run)."""
    out = subprocess.run(
        [sys.executable, str(CASES), *SIMULATED_CASES],
        env=_child_env(XLA_FLAGS=xla_flags_with_devices(8)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0 and out.stdout.endswith("OK\n"), out.stderr[-4000:]
    reported = re.findall(r"^case (\w+): (OK|FAILED)$", out.stdout, re.M)
    assert [name for name, _ in reported] == SIMULATED_CASES
    failed = [name for name, status in reported if status == "FAILED"]
    assert not failed, out.stdout[-8000:]


# ------------------------------------------------------------- two real processes


def test_two_processes_data_parallel(tmp_path):
    """Two processes of 4 CPU devices each form one 8-device mesh; a few
    data-parallel steps end with the same parameters in both, equal to one
    process's run."""
    import _sharding_cases

    port = localhost_port()
    env = _child_env(XLA_FLAGS=xla_flags_with_devices(None))  # 4 devices: set inside
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    logs = [open(tmp_path / f"process{i}.log", "w+") for i in range(2)]
    procs = []
    try:
        for i in range(2):
            args = [sys.executable, str(CASES), "worker", str(i), str(port), outs[i]]
            procs.append(
                subprocess.Popen(
                    args, env=env, stdout=logs[i], stderr=subprocess.STDOUT
                )
            )
        codes = [p.wait(timeout=420) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        text = []
        for log in logs:
            log.seek(0)
            text.append(log.read()[-3000:])
            log.close()
    assert codes == [0, 0], "\n----\n".join(text)
    results = [np.load(path) for path in outs]
    names = sorted(results[0].files)
    assert names == sorted(results[1].files)
    for name in names:  # identical in both processes
        np.testing.assert_array_equal(results[0][name], results[1][name])
    ref_losses, ref_leaves = _sharding_cases.reference_on_cpu()
    np.testing.assert_allclose(results[0]["losses"], ref_losses, rtol=1e-5, atol=1e-5)
    assert len(ref_leaves) == len(names) - 1
    for i, want in enumerate(ref_leaves):
        np.testing.assert_allclose(results[0][f"leaf{i}"], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- rules and plans
def _tree():
    return {
        "encoder": {"layers": [{"weight": jnp.ones((16, 8)), "bias": jnp.ones(16)}]},
        "scale": jnp.ones(()),
        "name": "enc",
    }


def test_plan_first_match_wins_and_bytes():
    rules = [
        (r"encoder\.layers\.\d+\.weight", P("data", None)),
        (r".*weight", P(None, "data")),
        ("nothing", P()),
    ]
    plan = bw.sharding_plan(_tree(), MESH8, rules, show=False)
    rows = {r.path: r for r in plan.rows}
    assert set(rows) == {"encoder.layers.0.weight", "encoder.layers.0.bias", "scale"}
    w = rows["encoder.layers.0.weight"]
    assert (w.spec, w.shard_shape, w.bytes_per_device) == (P("data", None), (2, 8), 64)
    assert w.rule == r"rules[0] 'encoder\\.layers\\.\\d+\\.weight'"
    assert rows["encoder.layers.0.bias"].spec == P()  # unmatched: replicated
    assert rows["encoder.layers.0.bias"].rule == "-"
    assert plan.bytes_total == 16 * 8 * 4 + 16 * 4 + 4
    assert plan.bytes_per_device == 64 + 16 * 4 + 4
    assert plan.unused_rules == (1, 2)


def test_plan_prints_its_table(capsys):
    plan = bw.sharding_plan(_tree(), MESH8, [(".*weight", P("data"))])
    printed = capsys.readouterr().out
    assert printed == str(plan) + "\n"
    assert re.search(r"encoder\.layers\.0\.weight +\(16, 8\) +float32 +P\('data'\)"
                     r" +\(2, 8\) +64 B +rules\[0\]", printed)  # fmt: skip
    assert "total: 580 B; per device: 132 B (mesh data=8)" in printed


def test_plan_moves_nothing():
    tree = {"w": jnp.ones((8, 2))}
    before = tree["w"].sharding
    bw.sharding_plan(tree, MESH8, [("w", P("data"))], show=False)
    assert tree["w"].sharding == before


def test_plan_of_an_abstract_model():
    model = bw.filter_eval_shape(bw.nn.Linear, 64, 32, key=jax.random.key(0))
    plan = bw.sharding_plan(model, MESH8, bw.fsdp(min_size=100), show=False)
    assert [(r.path, r.shard_shape) for r in plan.rows] == [
        ("weight", (32, 8)),  # (32, 64): the larger dimension is split
        ("bias", (32,)),
    ]


def test_rule_not_dividing_a_dimension():
    with pytest.raises(ValueError, match=r"leaf `w` of shape \(4, 3\).*dimension 1 "
                       r"\(size 3\) is not divisible by 8"):  # fmt: skip
        bw.sharding_plan({"w": jnp.ones((4, 3))}, MESH8, [("w", P(None, "data"))])


def test_axis_not_in_mesh():
    with pytest.raises(
        ValueError,
        match=r"rules\[0\] = \('w', P\(None, 'model'\)\) does not fit leaf `w` of "
        r"shape \(4, 8\).*mesh axis 'model' is not in the mesh, whose axes are "
        r"\('data',\)",
    ):
        bw.sharding_plan({"w": jnp.ones((4, 8))}, MESH8, [("w", P(None, "model"))])


def test_spec_longer_than_rank():
    with pytest.raises(ValueError, match=r"leaf `b` of shape \(8,\).*2 entries but "
                       r"the array has rank 1"):  # fmt: skip
        bw.sharding_plan({"b": jnp.ones(8)}, MESH8, [("b", P("data", None))])


def test_axis_used_twice():
    with pytest.raises(ValueError, match="mesh axis 'data' is used twice"):
        bw.sharding_plan({"w": jnp.ones((8, 8))}, MESH8, [("w", P("data", "data"))])


def test_tuple_of_axes_splits_one_dimension():
    plan = bw.sharding_plan(
        {"w": jnp.ones((16, 3))}, MESH24, [("w", P(("data", "model")))], show=False
    )
    assert plan.rows[0].shard_shape == (2, 3)
    with pytest.raises(ValueError, match=r"size 12\) is not divisible by 8, the "
                       r"size of mesh axes \('data', 'model'\)"):  # fmt: skip
        bw.sharding_plan({"w": jnp.ones(12)}, MESH24, [("w", P(("data", "model")))])


@pytest.mark.parametrize(
    "rules, error, message",
    [
        ("w", TypeError, r"`rules` must be a sequence of `\(pattern, spec\)` pairs"),
        ([("w",)], TypeError, r"`rules\[0\]` is \('w',\), not a pair"),
        ([(3, P())], TypeError, r"`rules\[0\]`: the pattern must be a string"),
        ([("w(", P())], ValueError, r"`rules\[0\]`: 'w\(' is not a valid regular"),
        ([("w", "data")], TypeError, r"Write `PartitionSpec\('data'\)` for one axis"),
    ],
)
def test_malformed_rules(rules, error, message):
    with pytest.raises(error, match=message):
        bw.sharding_plan({"w": jnp.ones(8)}, MESH8, rules)


def test_not_a_mesh():
    with pytest.raises(TypeError, match=r"`mesh` must be a `jax.sharding.Mesh`"):
        bw.shard({"w": jnp.ones(8)}, jax.devices()[0], [])


def test_patterns_match_whole_paths():
    rules = [("layers.0", P("data"))]  # not `layers.0.weight`: fullmatch
    plan = bw.sharding_plan({"layers": [jnp.ones(8)]}, MESH8, rules, show=False)
    assert plan.rows[0].spec == P("data")
    plan = bw.sharding_plan({"layers": [{"w": jnp.ones(8)}]}, MESH8, rules, show=False)
    assert plan.rows[0].spec == P()


# -------------------------------------------------------------------- strategies
def test_data_parallel_replicates_everything():
    plan = bw.sharding_plan(_tree(), MESH8, bw.data_parallel(), show=False)
    assert {r.spec for r in plan.rows} == {P()}


def test_fsdp_splits_the_largest_divisible_dimension():
    [(_, spec)] = bw.fsdp(min_size=10)
    assert spec((24, 64), MESH8) == P(None, "data")
    assert spec((64, 64), MESH8) == P("data")  # tie: the earliest
    assert spec((12, 7), MESH8) == P()  # nothing divisible by 8
    assert spec((2, 4), MESH8) == P()  # below min_size
    assert spec((4, 16, 3), MESH8) == P(None, "data")
    with pytest.raises(ValueError, match=r"leaf `w` of shape \(8, 8\).*mesh axis "
                       r"'model' is not in the mesh.*`fsdp\(axis=...\)`"):  # fmt: skip
        bw.sharding_plan({"w": jnp.ones((8, 8))}, MESH8, bw.fsdp("model", 1))


def test_tensor_parallel_rules(getkey):
    class Block(bw.Module):
        attn: bw.nn.MultiheadAttention
        mlp: bw.nn.MLP
        head: bw.nn.Linear

    model = Block(
        bw.nn.MultiheadAttention(4, 16, key=getkey()),
        bw.nn.MLP(16, 16, 32, depth=2, key=getkey()),
        bw.nn.Linear(16, 8, use_bias=False, key=getkey()),
    )
    rules = bw.tensor_parallel(model, "model")
    plan = bw.sharding_plan(model, MESH24, rules, show=False)
    specs = {r.path: r.spec for r in plan.rows}
    assert specs == {
        "attn.query_proj.weight": P("model", None),
        "attn.key_proj.weight": P("model", None),
        "attn.value_proj.weight": P("model", None),
        "attn.output_proj.weight": P(None, "model"),
        "mlp.layers.0.weight": P("model", None),
        "mlp.layers.0.bias": P("model"),
        "mlp.layers.1.weight": P(None, "model"),
        "mlp.layers.1.bias": P(),
        "mlp.layers.2.weight": P("model", None),
        "mlp.layers.2.bias": P("model"),
        "head.weight": P("model", None),
    }
    # the same rules shard an optimiser state that mirrors the model
    state = {"mu": model, "count": jnp.zeros((), jnp.int32)}
    plan = bw.sharding_plan(state, MESH24, rules, show=False)
    specs = {r.path: r.spec for r in plan.rows}
    assert specs["mu.mlp.layers.1.weight"] == P(None, "model")
    assert specs["count"] == P()


def test_tensor_parallel_stacked_mlp(getkey):
    mlp = bw.nn.MLP(8, 8, 16, depth=3, scan=True, key=getkey())
    plan = bw.sharding_plan(mlp, MESH24, bw.tensor_parallel(mlp), show=False)
    specs = {r.path: r.spec for r in plan.rows}
    assert specs["layers.1.weight"] == P(None, None, "model")  # stacked, row
    assert specs["layers.2.weight"] == P("model", None)


# --------------------------------------------------------- placing on one device
def test_shard_places_arrays_and_keeps_other_leaves():
    mesh = bw.make_mesh((1,), ("data",))
    out = bw.shard(_tree(), mesh, [(".*weight", P("data"))])
    assert out["name"] == "enc"
    weight = out["encoder"]["layers"][0]["weight"]
    assert weight.sharding == jax.sharding.NamedSharding(mesh, P("data"))
    assert out["scale"].sharding == jax.sharding.NamedSharding(mesh, P())
    np.testing.assert_array_equal(weight, np.ones((16, 8)))


def test_named_shardings_is_a_prefix_for_filter_shard():
    mesh = bw.make_mesh((1,), ("data",))
    shardings = bw.named_shardings(_tree(), mesh, [(".*weight", P("data"))])
    assert shardings["name"] is None
    assert shardings["encoder"]["layers"][0]["weight"].spec == P("data")

    @jax.jit
    def f(tree):
        return bw.filter_shard(jax.tree.map(lambda a: a * 2, tree), shardings)

    tree = bw.filter(_tree(), bw.is_array)
    jaxpr = str(jax.make_jaxpr(f)(tree))  # under jit: a constraint per array
    assert jaxpr.count("sharding_constraint") == 3 and "P('data',)" in jaxpr
    out = bw.filter_shard(_tree(), shardings)  # outside jit: device_put
    assert out["name"] == "enc"
    assert out["encoder"]["layers"][0]["weight"].sharding.spec == P("data")


def test_filter_shard_to_a_device():
    device = jax.devices()[0]
    out = bw.filter_shard((jnp.ones(3), np.ones(2), 1.5), device)
    assert out[2] == 1.5
    assert out[1].devices() == {device} and isinstance(out[1], jax.Array)


def test_shard_batch_errors():
    with pytest.raises(ValueError, match=re.escape(
        "`batch.x` of shape (12, 3): the batch size 12 is not divisible by 8, the "
        "size of mesh axis 'data'. Use a batch size that is a multiple of 8 (e.g. 8)"
    )):  # fmt: skip
        bw.shard_batch({"x": np.ones((12, 3)), "y": np.ones((16,))}, MESH8)
    with pytest.raises(ValueError, match=r"`batch.1` is a scalar"):
        bw.shard_batch((np.ones(8), np.float32(1.0)), MESH8)
    with pytest.raises(ValueError, match=r"`axis='batch'` is not an axis of the "
                       r"mesh, whose axes are \('data',\)"):  # fmt: skip
        bw.shard_batch(np.ones(8), MESH8, axis="batch")


def test_shard_batch_on_one_device():
    mesh = bw.make_mesh((1,), ("data",))
    x, label = bw.shard_batch((np.ones((5, 2), np.float32), "label"), mesh)
    assert label == "label"
    assert x.sharding == jax.sharding.NamedSharding(mesh, P("data"))


# ------------------------------------------- filter_jit(in_shardings, out_shardings)
def test_jit_shardings_leaf_types_are_checked():
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(TypeError, match=re.escape(
        "`filter_jit(in_shardings=...)`: `in_shardings[1]` is 'data'; each leaf "
        "must be a `jax.sharding.Sharding`"
    )):  # fmt: skip
        bw.filter_jit(lambda x, y: x, in_shardings=(sharding, "data"))
    with pytest.raises(TypeError, match=r"`out_shardings\['w'\]` is P\('data',\)"):
        bw.filter_jit(out_shardings={"w": P("data")})


def test_jit_shardings_must_be_prefixes():
    device = jax.devices()[0]
    f = bw.filter_jit(lambda x, y: x + y, in_shardings=(device, device, device))
    with pytest.raises(ValueError, match=r"`filter_jit\(in_shardings=...\)` must be a "
                       r"pytree prefix of the positional arguments"):  # fmt: skip
        f(jnp.ones(2), jnp.ones(2))
    g = bw.filter_jit(lambda x: (x, x), out_shardings=[device, device])
    with pytest.raises(ValueError, match=r"must be a pytree prefix of the output"):
        g(jnp.ones(2))


def test_jit_shardings_on_one_device(getkey):
    device = jax.devices()[0]
    mesh = bw.make_mesh((1,), ("data",))
    linear = bw.nn.Linear(3, 2, key=getkey())
    shardings = bw.named_shardings(linear, mesh, [(".*", P())])

    @bw.filter_jit(in_shardings=(shardings, device), out_shardings=(shardings, None))
    def f(model, x, *, scale):
        return model, model(x) * scale

    model, y = f(linear, jnp.ones(3), scale=jnp.float32(2.0))
    assert model.weight.sharding == shardings.weight
    np.testing.assert_allclose(y, linear(jnp.ones(3)) * 2, rtol=1e-6)
    method = bw.filter_jit(linear.__call__, in_shardings=device)  # bound method
    np.testing.assert_allclose(method(jnp.ones(3)), linear(jnp.ones(3)), rtol=1e-6)
