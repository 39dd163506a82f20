"""The core of two of Equinox's documented examples (stateful layers; freezing a
layer), run as Equinox code twice in one subprocess: first with `equinox` pointing at
boxwood (real Equinox not yet imported), then with real Equinox. The numbers must
agree."""

import json
import subprocess
import sys

import numpy as np
import pytest

from _child_flags import child_env

pytest.importorskip("equinox")
pytest.importorskip("optax")

ALIAS = """
import sys
import boxwood, boxwood.debug, boxwood.internal, boxwood.nn
sys.modules["equinox"] = boxwood
sys.modules["equinox.nn"] = boxwood.nn
sys.modules["equinox.debug"] = boxwood.debug
sys.modules["equinox.internal"] = boxwood.internal
"""

# Equinox's docs/examples/stateful.ipynb (BatchNorm with Equinox's mode, written out
# so that both libraries use it) and frozen_layer.ipynb, shortened.
EXAMPLE = """
import json
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import optax


class Model(eqx.Module):
    norm1: eqx.nn.BatchNorm
    spectral_linear: eqx.nn.SpectralNorm[eqx.nn.Linear]
    norm2: eqx.nn.BatchNorm
    linear1: eqx.nn.Linear
    linear2: eqx.nn.Linear

    def __init__(self, key):
        key1, key2, key3, key4 = jr.split(key, 4)
        self.norm1 = eqx.nn.BatchNorm(input_size=3, axis_name="batch", mode=MODE)
        self.spectral_linear = eqx.nn.SpectralNorm(
            layer=eqx.nn.Linear(in_features=3, out_features=32, key=key1),
            weight_name="weight",
            key=key2,
        )
        self.norm2 = eqx.nn.BatchNorm(input_size=32, axis_name="batch", mode=MODE)
        self.linear1 = eqx.nn.Linear(in_features=32, out_features=32, key=key3)
        self.linear2 = eqx.nn.Linear(in_features=32, out_features=3, key=key4)

    def __call__(self, x, state):
        x, state = self.norm1(x, state)
        x, state = self.spectral_linear(x, state)
        x = jax.nn.relu(x)
        x, state = self.norm2(x, state)
        x = self.linear1(x)
        x = jax.nn.relu(x)
        x = self.linear2(x)
        return x, state


def compute_loss(model, state, xs, ys):
    batch_model = jax.vmap(
        model, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
    )
    pred_ys, state = batch_model(xs, state)
    return jnp.mean((pred_ys - ys) ** 2), state


@eqx.filter_jit
def make_step(model, state, opt_state, xs, ys):
    grads, state = eqx.filter_grad(compute_loss, has_aux=True)(model, state, xs, ys)
    updates, opt_state = optim.update(grads, opt_state)
    model = eqx.apply_updates(model, updates)
    return model, state, opt_state


results = {}
for MODE in ("ema", "batch"):
    mkey, xkey, xkey2 = jr.split(jr.PRNGKey(5678), 3)
    model, state = eqx.nn.make_with_state(Model)(mkey)
    xs = jr.normal(xkey, (10, 3))
    ys = jnp.sin(xs) + 1
    optim = optax.sgd(0.05)
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    for _ in range(5):
        model, state, opt_state = make_step(model, state, opt_state, xs, ys)
    inference_model = eqx.Partial(eqx.nn.inference_mode(model), state=state)
    out, _ = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(
        inference_model, jr.normal(xkey2, (5, 3))
    )
    results[MODE] = out.tolist()

# frozen_layer.ipynb: train only the last layer of an MLP.
model = eqx.nn.MLP(2, 1, 8, 1, key=jr.PRNGKey(0))
filter_spec = jtu.tree_map(lambda _: False, model)
filter_spec = eqx.tree_at(
    lambda tree: (tree.layers[-1].weight, tree.layers[-1].bias),
    filter_spec,
    replace=(True, True),
)


@eqx.filter_jit
def frozen_step(model, x, y, opt_state):
    diff_model, static_model = eqx.partition(model, filter_spec)

    @eqx.filter_grad
    def loss(diff_model, static_model, x, y):
        model = eqx.combine(diff_model, static_model)
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    grads = loss(diff_model, static_model, x, y)
    updates, opt_state = optim.update(grads, opt_state)
    return eqx.apply_updates(model, updates), opt_state


optim = optax.sgd(0.1)
opt_state = optim.init(model)
x = jr.normal(jr.PRNGKey(1), (32, 2))
y = jnp.sum(x, axis=1, keepdims=True)
first = model.layers[0].weight
for _ in range(5):
    model, opt_state = frozen_step(model, x, y, opt_state)
assert (model.layers[0].weight == first).all()
results["frozen"] = [a.tolist() for a in jtu.tree_leaves(eqx.filter(model, eqx.is_array))]
print(json.dumps(results))
"""


# Runs EXAMPLE (argv[1]) with `equinox` pointing at boxwood, then with real Equinox.
CHILD = (
    """
import json, sys

def run(expected_name):
    import equinox
    assert equinox.__name__ == expected_name, equinox.__name__
    namespace = {"__name__": "__example__"}
    exec(compile(sys.argv[1], "<example>", "exec"), namespace)
    return namespace["results"]
"""
    + ALIAS
    + """
ours = run("boxwood")
for name in [n for n in sys.modules if n == "equinox" or n.startswith("equinox.")]:
    del sys.modules[name]
theirs = run("equinox")
print(json.dumps({"ours": ours, "theirs": theirs}))
"""
)


def test_examples_give_equinox_numbers():
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, EXAMPLE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = json.loads(proc.stdout.strip().splitlines()[-1])
    ours, theirs = both["ours"], both["theirs"]
    assert ours.keys() == theirs.keys()
    for name in ("ema", "batch"):
        np.testing.assert_allclose(ours[name], theirs[name], atol=1e-5, err_msg=name)
    assert len(ours["frozen"]) == len(theirs["frozen"]) == 4
    for a, b in zip(ours["frozen"], theirs["frozen"]):
        np.testing.assert_allclose(a, b, atol=1e-6)
