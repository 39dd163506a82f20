"""Differential tests against the installed Equinox: every layer of `boxwood.nn`,
built with default arguments from the same key in both libraries, has the same
array leaves (key paths, shapes, dtypes), the same outputs and the same gradients.

Where the initial values differ by design (`ConvTranspose*`: boxwood draws from
PyTorch's bound, `1/sqrt(out_channels/groups * prod(kernel))`, Equinox from
`1/sqrt(in_channels/groups * prod(kernel))`), Equinox's arrays are copied into the
boxwood model leaf by leaf (the key paths are equal) before outputs and gradients
are compared. Non-array leaves are not compared: Equinox keeps plain functions and
flags such as `BatchNorm.inference` as leaves, boxwood holds them as static
structure (so `jax.jit(model)` works); see docs/migrating-from-equinox-layers.md.
"""

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

import boxwood
import boxwood.nn as bnn
from _precision import highest_matmul_precision  # noqa: F401

eqx = pytest.importorskip("equinox")

# float32 agreement to CPU-sized tolerances: full-precision matmuls on every backend
pytestmark = pytest.mark.usefixtures("highest_matmul_precision")


KEY = jr.key(42)
RNG = np.random.default_rng(0)


def normal(*shape):
    return jnp.asarray(RNG.normal(size=shape), jnp.float32)


def is_array(x):
    return isinstance(x, (jax.Array, np.ndarray))


def arrays_by_path(tree):
    """`{key path: array}` for the array leaves of `tree`, in leaf order."""
    pairs = jtu.tree_flatten_with_path(tree)[0]
    return {jtu.keystr(p): leaf for p, leaf in pairs if is_array(leaf)}


def with_arrays_of(model, source):
    """`model` with its array leaves replaced, in order, by those of `source`."""
    leaves, treedef = jtu.tree_flatten(model)
    new = iter([leaf for leaf in jtu.tree_leaves(source) if is_array(leaf)])
    leaves = [next(new) if is_array(leaf) else leaf for leaf in leaves]
    return jtu.tree_unflatten(treedef, leaves)


def floating(x):
    return is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def forward_and_grads(model, call, inputs, extra):
    """`(output, gradients)`: the gradients of `sum(output**2)` with respect to the
    model's floating arrays (in leaf order) and to `inputs`.

    Compiled once per case and library with a fresh `jax.jit` of the arrays alone
    (the rest of the model is closed over). A shared `equinox.filter_jit` cannot be
    used: with jax 0.10, the treedefs of two `register_dataclass` classes with equal
    static fields (boxwood's `LayerNorm(4)` and `RMSNorm(4)`) compare equal, and a
    shared compilation cache then serves one layer's function for the other.
    """
    leaves, treedef = jtu.tree_flatten(model)
    where = [i for i, leaf in enumerate(leaves) if floating(leaf)]
    argnums = (0, 1) if any(floating(x) for x in jtu.tree_leaves(inputs)) else 0

    def loss(params, inputs, extra):
        full = list(leaves)
        for i, p in zip(where, params):
            full[i] = p
        out = call(jtu.tree_unflatten(treedef, full), inputs, extra)
        total = sum(jnp.sum(o.astype(jnp.float32) ** 2) for o in jtu.tree_leaves(out))
        return total, out

    @jax.jit
    def run(params, inputs, extra):
        grads, out = jax.grad(loss, argnums, has_aux=True)(params, inputs, extra)
        return out, grads

    return run([leaves[i] for i in where], inputs, extra)


def plain(model, inputs, extra):
    return model(*inputs)


def with_key(model, inputs, extra):
    return model(*inputs, key=extra)


def vmapped_stateful(model, inputs, extra, **kwargs):
    call = lambda x, s: model(x, s, **kwargs)
    batched = jax.vmap(call, axis_name="b", in_axes=(0, None), out_axes=(0, None))
    return batched(inputs[0], extra)[0]


def stateful(model, inputs, extra):
    return model(inputs[0], extra)[0]


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[Any], Any]  # nn namespace -> model, or (model, state)
    inputs: tuple
    call: Callable = plain
    extra: Any = None  # a key, or None; a State comes from `build`
    same_init: bool = True


def scale(w, x):
    return w * x


def tied(nn):
    emb = nn.Embedding(5, 3, key=jr.fold_in(KEY, 1))
    lin = nn.Linear(3, 5, key=jr.fold_in(KEY, 2))
    return nn.Shared((emb, lin), lambda p: p[1].weight, lambda p: p[0].weight)


def call_tied(model, inputs, extra):
    emb, lin = model()
    return lin(emb(inputs[0]))


def sequential(nn):
    layers = [nn.Linear(3, 4, key=KEY), nn.Lambda(jax.nn.relu), nn.Identity()]
    return nn.Sequential(layers + [nn.Linear(4, 2, key=jr.fold_in(KEY, 1))])


def attention_inputs():
    return (normal(3, 4), normal(5, 4), normal(5, 4))


CASES = [
    Case("Linear", lambda nn: nn.Linear(3, 4, key=KEY), (normal(3),)),
    Case("Linear-scalar", lambda nn: nn.Linear("scalar", 2, key=KEY), (normal(),)),
    Case("Identity", lambda nn: nn.Identity(), (normal(3),)),
    Case("Conv1d", lambda nn: nn.Conv1d(2, 3, 3, key=KEY), (normal(2, 7),)),
    Case("Conv2d", lambda nn: nn.Conv2d(2, 3, 3, key=KEY), (normal(2, 5, 6),)),
    Case("Conv3d", lambda nn: nn.Conv3d(2, 3, 2, key=KEY), (normal(2, 3, 4, 3),)),
    Case("Conv", lambda nn: nn.Conv(2, 2, 3, 3, key=KEY), (normal(2, 5, 5),)),
    Case(
        "ConvTranspose1d",
        lambda nn: nn.ConvTranspose1d(2, 3, 3, key=KEY),
        (normal(2, 6),),
        same_init=False,
    ),
    Case(
        "ConvTranspose2d",
        lambda nn: nn.ConvTranspose2d(2, 3, 3, key=KEY),
        (normal(2, 4, 5),),
        same_init=False,
    ),
    Case(
        "ConvTranspose3d",
        lambda nn: nn.ConvTranspose3d(2, 3, 2, key=KEY),
        (normal(2, 3, 3, 2),),
        same_init=False,
    ),
    Case(
        "ConvTranspose",
        lambda nn: nn.ConvTranspose(1, 2, 3, 3, key=KEY),
        (normal(2, 6),),
        same_init=False,
    ),
    Case("Embedding", lambda nn: nn.Embedding(5, 3, key=KEY), (jnp.array(3),)),
    Case("GRUCell", lambda nn: nn.GRUCell(3, 4, key=KEY), (normal(3), normal(4))),
    Case(
        "LSTMCell",
        lambda nn: nn.LSTMCell(3, 4, key=KEY),
        (normal(3), (normal(4), normal(4))),
    ),
    Case("LayerNorm", lambda nn: nn.LayerNorm(4), (normal(4),)),
    Case("LayerNorm-2d", lambda nn: nn.LayerNorm((2, 3)), (normal(2, 3),)),
    Case("RMSNorm", lambda nn: nn.RMSNorm(4), (normal(4),)),
    Case("GroupNorm", lambda nn: nn.GroupNorm(2, 4), (normal(4, 5),)),
    Case("MLP", lambda nn: nn.MLP(3, 2, 4, 2, key=KEY), (normal(3),)),
    Case("MLP-scan", lambda nn: nn.MLP(3, 2, 4, 3, scan=True, key=KEY), (normal(3),)),
    Case(
        "MLP-PReLU",
        lambda nn: nn.MLP(3, 2, 4, 2, nn.PReLU(), nn.PReLU(0.1), key=KEY),
        (normal(3),),
    ),
    Case(
        "MLP-PReLU-scan",
        lambda nn: nn.MLP(3, "scalar", 4, 3, nn.PReLU(), scan=True, key=KEY),
        (normal(3),),
    ),
    Case(
        "MultiheadAttention",
        lambda nn: nn.MultiheadAttention(2, 4, key=KEY),
        attention_inputs(),
    ),
    Case("PReLU", lambda nn: nn.PReLU(), (normal(5),)),
    Case("Dropout", lambda nn: nn.Dropout(), (normal(50),), with_key, jr.key(3)),
    Case(
        "RotaryPositionalEmbedding",
        lambda nn: nn.RotaryPositionalEmbedding(4),
        (normal(6, 4),),
    ),
    Case("MaxPool1d", lambda nn: nn.MaxPool1d(2), (normal(2, 7),)),
    Case("MaxPool2d", lambda nn: nn.MaxPool2d(2), (normal(2, 5, 4),)),
    Case("MaxPool3d", lambda nn: nn.MaxPool3d(2), (normal(1, 3, 4, 3),)),
    Case("AvgPool1d", lambda nn: nn.AvgPool1d(2), (normal(2, 7),)),
    Case("AvgPool2d", lambda nn: nn.AvgPool2d(2), (normal(2, 5, 4),)),
    Case("AvgPool3d", lambda nn: nn.AvgPool3d(2), (normal(1, 3, 4, 3),)),
    Case("AdaptiveAvgPool1d", lambda nn: nn.AdaptiveAvgPool1d(3), (normal(2, 6),)),
    Case(
        "AdaptiveAvgPool2d",
        lambda nn: nn.AdaptiveAvgPool2d((2, 3)),
        (normal(2, 4, 6),),
    ),
    Case(
        "AdaptiveAvgPool3d",
        lambda nn: nn.AdaptiveAvgPool3d((2, 2, 1)),
        (normal(1, 4, 4, 3),),
    ),
    Case("AdaptiveMaxPool1d", lambda nn: nn.AdaptiveMaxPool1d(3), (normal(2, 6),)),
    Case(
        "AdaptiveMaxPool2d",
        lambda nn: nn.AdaptiveMaxPool2d((2, 3)),
        (normal(2, 4, 6),),
    ),
    Case(
        "AdaptiveMaxPool3d",
        lambda nn: nn.AdaptiveMaxPool3d((2, 2, 1)),
        (normal(1, 4, 4, 3),),
    ),
    Case(
        "AdaptivePool",
        lambda nn: nn.AdaptivePool(2, 1, jnp.max),
        (normal(3, 8),),
    ),
    Case("Lambda", lambda nn: nn.Lambda(jax.nn.relu), (normal(4),)),
    Case(
        "Lambda-Partial",
        lambda nn: nn.Lambda(
            (boxwood if nn is bnn else eqx).Partial(scale, jnp.arange(4.0))
        ),
        (normal(4),),
    ),
    Case("Sequential", sequential, (normal(3),)),
    Case("Shared", tied, (jnp.array(2),), call_tied),
    Case(
        "WeightNorm",
        lambda nn: nn.WeightNorm(nn.Linear(3, 4, key=KEY)),
        (normal(3),),
    ),
    Case(
        "SpectralNorm",
        lambda nn: nn.make_with_state(nn.SpectralNorm)(
            nn.Linear(3, 4, key=KEY), "weight", key=jr.fold_in(KEY, 1)
        ),
        (normal(3),),
        stateful,
    ),
    Case(
        "BatchNorm-batch",
        lambda nn: nn.make_with_state(nn.BatchNorm)(3, "b", mode="batch"),
        (normal(4, 3, 5),),
        vmapped_stateful,
    ),
    Case(
        "BatchNorm-ema",
        lambda nn: nn.make_with_state(nn.BatchNorm)(3, "b", mode="ema"),
        (normal(4, 3),),
        vmapped_stateful,
    ),
]


@pytest.fixture(autouse=True)
def _threefry_dropout_masks():
    """boxwood's dropout masks drawn with threefry, as Equinox draws them (on a
    TPU boxwood's default is the chip's own generator, whose masks differ)."""
    with bnn.dropout_generator("threefry"):
        yield


def build_both(case):
    theirs, ours = case.build(eqx.nn), case.build(bnn)
    if isinstance(ours, tuple) and isinstance(ours[1], bnn.State):
        (theirs, their_state), (ours, our_state) = theirs, ours
        return theirs, ours, their_state, our_state
    return theirs, ours, case.extra, case.extra


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    a_leaves, b_leaves = jtu.tree_leaves(a), jtu.tree_leaves(b)
    assert len(a_leaves) == len(b_leaves)
    for x, y in zip(a_leaves, b_leaves):
        assert jnp.shape(x) == jnp.shape(y) and jnp.result_type(x) == jnp.result_type(y)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_leaves_outputs_and_gradients(case):
    theirs, ours, their_extra, our_extra = build_both(case)
    theirs_arrays, ours_arrays = arrays_by_path(theirs), arrays_by_path(ours)
    assert list(ours_arrays) == list(theirs_arrays)
    for path, theirs_leaf in theirs_arrays.items():
        ours_leaf = ours_arrays[path]
        assert ours_leaf.shape == theirs_leaf.shape, path
        assert ours_leaf.dtype == theirs_leaf.dtype, path
        if case.same_init:
            np.testing.assert_array_equal(ours_leaf, theirs_leaf, err_msg=path)
    if not case.same_init:
        assert any(
            not np.array_equal(ours_arrays[p], theirs_arrays[p]) for p in ours_arrays
        ), "initialisations now agree: set same_init=True"
        ours = with_arrays_of(ours, theirs)
    out_theirs, grads_theirs = forward_and_grads(
        theirs, case.call, case.inputs, their_extra
    )
    out_ours, grads_ours = forward_and_grads(ours, case.call, case.inputs, our_extra)
    assert_trees_close(out_ours, out_theirs)
    assert_trees_close(grads_ours, grads_theirs, rtol=1e-4, atol=1e-5)


def test_adaptive_pool_bins_where_sizes_do_not_divide():
    # For 7 -> 3, boxwood by default splits as Equinox does (3, 2, 2 entries);
    # `bins="torch"` pools PyTorch's overlapping bins [0, 3), [2, 5), [4, 7).
    x = jnp.arange(7.0)[None]
    np.testing.assert_array_equal(bnn.AdaptiveAvgPool1d(3)(x), [[1.0, 3.5, 5.5]])
    np.testing.assert_array_equal(eqx.nn.AdaptiveAvgPool1d(3)(x), [[1.0, 3.5, 5.5]])
    torch_bins = bnn.AdaptiveAvgPool1d(3, bins="torch")(x)
    np.testing.assert_array_equal(torch_bins, [[1.0, 3.0, 5.0]])


def test_every_layer_is_covered():
    names = {c.name.split("-")[0] for c in CASES}
    layers = {
        name
        for name in dir(eqx.nn)
        if isinstance(getattr(eqx.nn, name), type)
        and issubclass(getattr(eqx.nn, name), eqx.Module)
    }
    not_layers = {"State", "StateIndex", "StatefulLayer", "Pool"}  # tested below
    # `Pool` is the base of MaxPool/AvgPool; `State*` are exercised by BatchNorm.
    assert layers - not_layers - names == set()


def check_state(theirs_state, ours_state, theirs, ours, fields):
    for name in fields:
        assert_trees_close(
            ours_state.get(getattr(ours, name)), theirs_state.get(getattr(theirs, name))
        )


@pytest.mark.parametrize(
    "mode, fields",
    [
        ("batch", ["batch_counter", "batch_state_index"]),
        ("ema", ["ema_first_time_index", "ema_state_index"]),
    ],
)
def test_batch_norm_modes_train_and_evaluate_as_equinox(mode, fields):
    build = lambda nn: nn.make_with_state(nn.BatchNorm)(2, "b", momentum=0.8, mode=mode)
    (theirs, ts), (ours, os_) = build(eqx.nn), build(bnn)
    check_state(ts, os_, theirs, ours, fields)

    def run(model, x, state):
        call = lambda x, s: model(x, s)
        return jax.vmap(call, axis_name="b", in_axes=(0, None), out_axes=(0, None))(
            x, state
        )

    # each library's own `filter_jit`, as its users write a step: one program per
    # mode (training, then evaluation), where eagerly each operation compiles
    run_theirs, run_ours = eqx.filter_jit(run), boxwood.filter_jit(run)
    for _ in range(3):
        x = 2 * normal(6, 2, 3) + 1
        y_theirs, ts = run_theirs(theirs, x, ts)
        y_ours, os_ = run_ours(ours, x, os_)
        assert_trees_close(y_ours, y_theirs)
        check_state(ts, os_, theirs, ours, fields)
    x = normal(5, 2, 3)
    theirs_eval, ours_eval = eqx.nn.inference_mode(theirs), bnn.inference_mode(ours)
    y_theirs, ts = run_theirs(theirs_eval, x, ts)
    y_ours, os_ = run_ours(ours_eval, x, os_)
    assert_trees_close(y_ours, y_theirs)
    check_state(ts, os_, theirs, ours, fields)


def test_batch_norm_legacy_mode_is_ema_in_both():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = eqx.nn.BatchNorm(3, "b")
        ours = bnn.BatchNorm(3, "b", mode="legacy")
    assert theirs.mode == ours.mode == "ema"


def test_dropout_and_attention_deterministic_match():
    x = normal(10)
    with pytest.warns(UserWarning):
        theirs = eqx.nn.Dropout(0.3, deterministic=True)
    with pytest.warns(DeprecationWarning):
        ours = bnn.Dropout(0.3, deterministic=True)
    assert ours.inference == theirs.inference is True
    np.testing.assert_array_equal(ours(x), theirs(x))


def test_layer_norm_elementwise_affine_matches():
    with pytest.warns(UserWarning):
        theirs = eqx.nn.LayerNorm(3, elementwise_affine=False)
    with pytest.warns(DeprecationWarning):
        ours = bnn.LayerNorm(3, elementwise_affine=False)
    assert arrays_by_path(ours) == arrays_by_path(theirs) == {}


@functools.cache
def _constructors():
    return [
        name
        for name in dir(eqx.nn)
        if isinstance(getattr(eqx.nn, name), type) and hasattr(bnn, name)
    ]


@pytest.mark.parametrize("name", _constructors())
def test_constructor_parameters_and_defaults(name):
    """Every parameter of Equinox's constructor exists in boxwood's, in the same
    order and of the same kind, with an equal default (an int `k` and Equinox's
    tuple `(k,) * n` count as equal: both mean `k` along every axis)."""
    import inspect

    theirs = inspect.signature(getattr(eqx.nn, name).__init__).parameters
    ours = inspect.signature(getattr(bnn, name).__init__).parameters
    shared = [p for p in theirs if p in ours]
    assert shared == list(theirs), f"missing: {set(theirs) - set(ours)}"
    assert [p for p in ours if p in theirs] == shared  # same order
    for p in shared:
        t, o = theirs[p], ours[p]
        assert t.kind == o.kind, p
        if name == "BatchNorm" and p == "mode":
            continue  # deliberate: boxwood defaults to "torch" (see the docs)
        if repr(t.default) == "<factory>":  # a dataclass default factory
            assert o.default is None, p  # boxwood: None means the same default
            continue
        if t.default is inspect.Parameter.empty or callable(t.default):
            continue  # (callable defaults: compared by behaviour in the cases)
        default = t.default
        if isinstance(default, tuple) and len(set(default)) == 1:
            default = (default[0], default)
        assert o.default == t.default or (
            isinstance(default, tuple) and o.default == default[0]
        ), f"{name}({p}=...): Equinox {t.default!r}, boxwood {o.default!r}"
