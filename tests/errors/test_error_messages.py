"""Errors on bad input: each case calls boxwood wrongly and checks the exception
class and the message (what is wrong, and the fix where the message gives one).
The calls are those no other test file gets wrong, and every layer of boxwood.nn
given an input of the wrong shape (the message names the layer with its
configuration, what it expected and what it got). docs/errors.md lists them all."""

import gzip
import inspect
import os

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import boxwood as bw
from boxwood import data, internal, nn

KEY = jr.key(0)


class Colour(bw.Enumeration):
    red = "it is red"
    blue = "it is blue"


class Size(bw.Enumeration):
    small = "small"


def _bad_enumeration_name():
    class Bad(bw.Enumeration):
        where = "clashes with a method"


def _bad_enumeration_base():
    class Bad(Colour, int):
        green = "green"


def _mesh():
    return bw.make_mesh((1,), ("data",))


def _idx_file(tmp_path, payload: bytes) -> str:
    path = os.fspath(tmp_path / "x-idx1-ubyte.gz")
    with gzip.open(path, "wb") as f:
        f.write(payload)
    return path


# id -> (call, exception class, message pattern); calls taking `tmp_path` get it
CASES = {
    # modules and filters
    "field-converter": (
        lambda: bw.field(converter=3),
        TypeError,
        r"`field\(converter=\.\.\.\)` must be callable, got int",
    ),
    "partial-not-callable": (
        lambda: bw.Partial(3, 1),
        TypeError,
        r"`Partial` needs a callable as its first argument, got int",
    ),
    "combine-nothing": (
        lambda: bw.combine(),
        TypeError,
        r"`combine` needs at least one pytree",
    ),
    "tree-at-both": (
        lambda: bw.tree_at(lambda t: t[0], [1], replace=2, replace_fn=abs),
        ValueError,
        r"`tree_at` takes exactly one of `replace=` or `replace_fn=`",
    ),
    # transformations
    "vmap-keyword-arguments": (
        lambda: bw.filter_vmap(lambda x: x)(x=jnp.ones(2)),
        TypeError,
        r"Functions vectorised with `filter_vmap` take positional arguments only; "
        r"got keyword arguments \['x'\]",
    ),
    "vmap-nothing-vectorised": (
        lambda: bw.filter_vmap(lambda x: x, in_axes=None)(jnp.ones(2)),
        ValueError,
        r"`filter_vmap`: no argument is vectorised .* Pass `axis_size=`",
    ),
    "vmap-unhashable-option": (
        lambda: bw.filter_vmap(lambda x: x, spmd_axis_name=["a"]),
        TypeError,
        r"`filter_vmap`: the options passed on to `jax.vmap` must be hashable",
    ),
    "vmap-dict-axes-without-signature": (
        lambda: bw.filter_vmap(max, in_axes={"x": 0})(jnp.ones(2), jnp.ones(2)),
        TypeError,
        r"`filter_vmap\(in_axes=dict\(\.\.\.\)\)` needs the signature of .* tuple",
    ),
    "pmap-keyword-arguments": (
        lambda: bw.filter_pmap(lambda x: x)(x=jnp.ones(1)),
        TypeError,
        r"Functions parallelised with `filter_pmap` take positional arguments only",
    ),
    "pmap-donate": (
        lambda: bw.filter_pmap(lambda x: x, donate="some"),
        ValueError,
        r"`filter_pmap\(donate=\.\.\.\)` must be 'none', 'all' or 'warn'; got 'some'",
    ),
    "scan-lengths": (
        lambda: bw.filter_scan(
            lambda c, x: (c, None), 0.0, {"a": jnp.ones(3), "b": jnp.ones(4)}
        ),
        ValueError,
        r"`filter_scan`: the arrays of `xs` must share the size of their leading axis",
    ),
    "jvp-tangent-structure": (
        lambda: bw.filter_jvp(lambda x: x, (jnp.ones(2),), ({"a": 1.0},)),
        ValueError,
        r"`filter_jvp`: `tangents` must have the structure of `primals`",
    ),
    "closure-convert-new-shapes": (
        lambda: bw.filter_closure_convert(lambda x: x * 2, jnp.ones(2))(jnp.ones(3)),
        ValueError,
        r"A function from `filter_closure_convert` was called with arrays of other "
        r"shapes or dtypes .* Convert it again",
    ),
    "closure-convert-new-static": (
        lambda: bw.filter_closure_convert(lambda x, n: x * n, jnp.ones(2), 2)(
            jnp.ones(2), 3
        ),
        ValueError,
        r"called with other non-array arguments",
    ),
    "callback-both-vmap-options": (
        lambda: bw.filter_pure_callback(
            lambda x: x,
            jnp.ones(2),
            result_shape_dtypes=jax.ShapeDtypeStruct((2,), jnp.float32),
            vmap_method="sequential",
            vectorized=True,
        ),
        ValueError,
        r"`filter_pure_callback` takes `vmap_method=` or the older `vectorized=`, "
        r"not both",
    ),
    # runtime errors
    "error-if-message-type": (
        lambda: bw.error_if(jnp.ones(2), jnp.array(False), 3),
        TypeError,
        r"`msg` must be a string; got int 3",
    ),
    "branched-error-if-messages": (
        lambda: bw.branched_error_if(jnp.ones(2), jnp.array(False), 0, []),
        TypeError,
        r"`msgs` must be a non-empty sequence of strings; got \(\)",
    ),
    "error-if-on-error": (
        lambda: bw.error_if(jnp.ones(2), jnp.array(False), "m", on_error="loud"),
        ValueError,
        r"`on_error` must be 'default' or one of raise, nan, breakpoint, off; "
        r"got 'loud'",
    ),
    "error-if-no-array": (
        lambda: jax.jit(lambda p: bw.error_if(3, p, "m"))(jnp.array(False)),
        ValueError,
        r"`error_if` needs at least one array in `x` .* Pass an array",
    ),
    # enumerations
    "enumeration-reserved-name": (
        _bad_enumeration_name,
        ValueError,
        r"An enumeration item cannot be named `where`: it is a method",
    ),
    "enumeration-base": (
        _bad_enumeration_base,
        TypeError,
        r"`Bad`: an enumeration can only inherit from enumerations",
    ),
    "enumeration-unknown-item": (
        lambda: Colour.green,
        AttributeError,
        r"Enumeration `Colour` has no item `green`",
    ),
    "enumeration-index": (
        lambda: Colour[Size.small],
        ValueError,
        r"`Colour\[\.\.\.\]` takes an item of `Colour`; got EnumerationItem",
    ),
    "enumeration-compare": (
        lambda: Colour.red == Size.small,
        ValueError,
        r"An item of `Colour` can only be compared with items of the same "
        r"enumeration",
    ),
    "enumeration-promote": (
        lambda: Colour.promote(3),
        ValueError,
        r"`Colour.promote` takes an enumeration item",
    ),
    "enumeration-promote-unrelated": (
        lambda: Colour.promote(Size.small),
        ValueError,
        r"`Colour.promote` converts items of the enumerations it inherits from; "
        r"`Size` is not one of them",
    ),
    "enumeration-where-pred": (
        lambda: Colour.where(jnp.ones(2, bool), Colour.red, Colour.blue),
        ValueError,
        r"`Colour.where` needs a scalar boolean `pred`; got shape \(2,\)",
    ),
    "enumeration-where-item": (
        lambda: Colour.where(jnp.array(True), Colour.red, Size.small),
        ValueError,
        r"`Colour.where`: `.*` must be an item of `Colour`",
    ),
    # internal loops and ω
    "while-loop-base": (
        lambda: internal.while_loop(
            lambda c: c < 3, lambda c: c + 1, 0, max_steps=4, kind="bounded", base=1
        ),
        ValueError,
        r"`base` must be an int >= 2; got 1",
    ),
    "while-loop-checkpoints": (
        lambda: internal.while_loop(
            lambda c: c < 3,
            lambda c: c + 1,
            0,
            max_steps=4,
            kind="checkpointed",
            checkpoints=0,
        ),
        ValueError,
        r"`checkpoints` must be an int >= 1; got 0",
    ),
    "scan-kind": (
        lambda: internal.scan(lambda c, x: (c, x), 0, jnp.ones(3), kind="fast"),
        ValueError,
        r"`kind` must be 'lax' or 'checkpointed'; got 'fast'",
    ),
    "scan-length": (
        lambda: internal.scan(
            lambda c, x: (c, x), 0, jnp.ones(3), 4, kind="checkpointed"
        ),
        ValueError,
        r"`scan`: `xs` and `length` give different lengths \[3, 4\]",
    ),
    "scan-checkpoints": (
        lambda: internal.scan(
            lambda c, x: (c, x), 0, jnp.ones(3), kind="checkpointed", checkpoints=0
        ),
        ValueError,
        r"`checkpoints` must be >= 1 or 'all'; got 0",
    ),
    "omega-structure": (
        lambda: internal.ω([1.0]) + internal.ω([1.0, 2.0]),
        ValueError,
        r"`ω \+ ω` needs pytrees of the same structure",
    ),
    "omega-operand": (
        lambda: internal.ω([1.0]) + "x",
        TypeError,
        r"`ω \+ \.\.\.` takes another `ω`, a scalar or an array; got str",
    ),
    "omega-operand-reflected": (
        lambda: "x" @ internal.ω([1.0]),
        TypeError,
        r"`\.\.\. @ ω` takes another `ω`, a scalar or an array; got str",
    ),
    "max-traces": (
        lambda: _traced_twice(),
        RuntimeError,
        r"can only be traced 1 times \(`assert_max_traces`\), but this is "
        r"trace number 2",
    ),
    # sharding
    "rules-not-a-sequence": (
        lambda: bw.shard(jnp.ones(2), _mesh(), "x"),
        TypeError,
        r"`rules` must be a sequence of `\(pattern, spec\)` pairs",
    ),
    "rules-not-a-pair": (
        lambda: bw.shard(jnp.ones(2), _mesh(), [("x",)]),
        TypeError,
        r"`rules\[0\]` is \('x',\), not a pair",
    ),
    "rules-pattern": (
        lambda: bw.shard(jnp.ones(2), _mesh(), [(3, P())]),
        TypeError,
        r"`rules\[0\]`: the pattern must be a string \(a regular expression\), got 3",
    ),
    "rules-regex": (
        lambda: bw.shard(jnp.ones(2), _mesh(), [("(", P())]),
        ValueError,
        r"`rules\[0\]`: '\(' is not a valid regular expression",
    ),
    "rules-spec": (
        lambda: bw.shard(jnp.ones(2), _mesh(), [(".*", "data")]),
        TypeError,
        r"`rules\[0\]`: the spec must be a `jax.sharding.PartitionSpec`, `None` or a "
        r"callable, got 'data'. Write `PartitionSpec\('data'\)`",
    ),
    "rules-callable-returns": (
        lambda: bw.shard({"w": jnp.ones(2)}, _mesh(), [(".*", lambda s, m: "data")]),
        ValueError,
        r"Sharding rule rules\[0\] = .* does not fit leaf `w` of shape \(2,\).*: it "
        r"returned 'data', not a PartitionSpec or None",
    ),
    "mesh-type": (
        lambda: bw.shard(jnp.ones(2), "mesh", []),
        TypeError,
        r"`mesh` must be a `jax.sharding.Mesh` \(or `AbstractMesh`\), got str",
    ),
    "fsdp-axis": (
        lambda: bw.shard(jnp.ones((2048,)), _mesh(), bw.fsdp(axis="model")),
        ValueError,
        r"mesh axis 'model' is not in the mesh, whose axes are \('data',\)",
    ),
    "shard-batch-axis": (
        lambda: bw.shard_batch(jnp.ones(4), _mesh(), axis="model"),
        ValueError,
        r"`axis='model'` is not an axis of the mesh, whose axes are \('data',\)",
    ),
    "shard-batch-scalar": (
        lambda: bw.shard_batch({"x": jnp.ones(())}, _mesh()),
        ValueError,
        r"`batch.x` is a scalar \(shape \(\)\); `shard_batch` splits the leading "
        r"dimension",
    ),
    # initialisation
    "init-where-outside": (
        lambda: nn.init(
            nn.Linear(2, 2, key=KEY),
            lambda m: jnp.ones(2),
            jax.nn.initializers.zeros,
            key=KEY,
        ),
        ValueError,
        r"nn.init: `where` returned .* \(item 0\), which is not part of the model",
    ),
    "init-wrong-shape": (
        lambda: nn.init(
            nn.Linear(2, 2, key=KEY),
            lambda m: m.weight,
            lambda k, s, d: jnp.zeros(3, d),
            key=KEY,
        ),
        ValueError,
        r"nn.init: the initialiser returned \(3,\) for `weight`, called with shape "
        r"\(2, 2\)",
    ),
    "layer-init-not-a-function": (
        lambda: nn.Linear(2, 2, weight_init=3, key=KEY),
        TypeError,
        r"Linear: `weight_init` must be a function `\(key, shape, dtype\) -> array`",
    ),
    "layer-init-wrong-shape": (
        lambda: nn.Linear(2, 2, weight_init=lambda k, s, d: jnp.zeros(3), key=KEY),
        ValueError,
        r"Linear: `weight_init` returned .*, but it was called with shape \(2, 2\)",
    ),
    # layer options
    "conv-groups": (
        lambda: nn.Conv1d(3, 4, 1, groups=2, key=KEY),
        ValueError,
        r"`groups` must divide `in_channels`, got in_channels=3 and groups=2",
    ),
    "conv-padding": (
        lambda: nn.Conv1d(2, 2, 3, padding=-1, key=KEY),
        ValueError,
        r"`padding` must be non-negative, got -1",
    ),
    "conv-padding-form": (
        lambda: nn.Conv1d(2, 2, 3, padding=(1, 2, 3), key=KEY),
        ValueError,
        r"`padding` must be a string \('SAME', 'SAME_LOWER', 'VALID'\), an int, a "
        r"sequence of 1 ints or a sequence of 1 \(low, high\) pairs, got \(1, 2, 3\)",
    ),
    "conv-dtype": (
        lambda: nn.Conv1d(2, 2, 3, dtype=jnp.int32, key=KEY),
        ValueError,
        r"Conv1d: `dtype` must be a floating-point or complex dtype such as "
        r"jnp.float32, got int32\.",
    ),
    "pool-operation": (
        lambda: nn.Pool(0.0, 3, 1, 2),
        ValueError,
        r"`operation` must be callable, got 3",
    ),
    "pool-padding": (
        lambda: nn.MaxPool1d(2, padding=3),
        ValueError,
        r"`padding` must be at most `kernel_size` on each side",
    ),
    "adaptive-pool-operation": (
        lambda: nn.AdaptivePool(2, 1, 3),
        ValueError,
        r"`operation` must be callable, got 3",
    ),
    "mlp-depth": (
        lambda: nn.MLP(2, 2, 4, -1, key=KEY),
        ValueError,
        r"MLP: `depth` must be a non-negative int, got -1",
    ),
    "stacked-depth": (
        lambda: nn.Stacked(lambda k: nn.Linear(2, 2, key=k), 0, key=KEY),
        ValueError,
        r"Stacked: `depth` must be a positive int, got 0",
    ),
    "layer-norm-eps": (
        lambda: nn.LayerNorm(4, eps=-1.0),
        ValueError,
        r"LayerNorm: `eps` must be a non-negative float, got -1.0",
    ),
    "layer-norm-shape": (
        lambda: nn.LayerNorm(-2),
        ValueError,
        r"LayerNorm: `shape` must not be negative, got \(-2,\)",
    ),
    "group-norm-groups": (
        lambda: nn.GroupNorm(0, 4),
        ValueError,
        r"GroupNorm: `groups` must be a positive int, got 0",
    ),
    "group-norm-divide": (
        lambda: nn.GroupNorm(3, 8),
        ValueError,
        r"GroupNorm: `groups=3` must divide `channels=8`",
    ),
    "group-norm-channels": (
        lambda: nn.GroupNorm(2),
        ValueError,
        r"GroupNorm: `channels` must be given when `channelwise_affine=True`",
    ),
    "batch-norm-momentum": (
        lambda: nn.BatchNorm(4, "batch", momentum=1.0),
        ValueError,
        r"BatchNorm: `momentum` must be in \[0, 1\), got 1.0",
    ),
    "batch-norm-mode": (
        lambda: nn.BatchNorm(4, "batch", mode="fast"),
        ValueError,
        r"BatchNorm: `mode` must be one of 'torch' .*, got 'fast'",
    ),
    "embedding-arguments": (
        lambda: nn.Embedding(10),
        ValueError,
        r"Embedding: pass either `Embedding\(num_embeddings, embedding_size, "
        r"key=key\)` or `Embedding\(weight=table\)`",
    ),
    "embedding-table-shape": (
        lambda: nn.Embedding(weight=jnp.ones(3)),
        ValueError,
        r"Embedding: pass either .* Got a table of shape \(3,\)",
    ),
    "embedding-table-sizes": (
        lambda: nn.Embedding(4, 2, weight=jnp.ones((3, 2))),
        ValueError,
        r"Embedding: `weight` has shape \(3, 2\), but `num_embeddings` and "
        r"`embedding_size` say \(4, 2\)",
    ),
    "lstm-hidden-pair": (
        lambda: nn.LSTMCell(2, 3, key=KEY)(jnp.ones(2), jnp.ones(3)),
        ValueError,
        r"LSTMCell\(input_size=2, hidden_size=3\): `hidden` must be the pair "
        r"`\(h, c\)`, got ArrayImpl",
    ),
    "conv-transpose-empty-output": (
        lambda: nn.ConvTranspose1d(1, 1, 3, padding=5, key=KEY)(jnp.ones((1, 2))),
        ValueError,
        r"ConvTranspose1d\(in_channels=1\): input spatial shape \(2,\) gives an empty "
        r"output; use a larger input or less padding",
    ),
    "weight-norm-axis": (
        lambda: nn.WeightNorm(nn.Linear(2, 2, key=KEY), axis=3),
        ValueError,
        r"WeightNorm: `axis=3` is out of range for the 2-dimensional weight 'weight'",
    ),
    "rope-size": (
        lambda: nn.RotaryPositionalEmbedding(3),
        ValueError,
        r"RotaryPositionalEmbedding: `embedding_size` must be even and non-negative, "
        r"got 3",
    ),
    "sequential-index": (
        lambda: nn.Sequential([nn.Identity()])["a"],
        TypeError,
        r"Sequential indices must be ints or slices, got str",
    ),
    # state
    "state-index-function": (
        lambda: nn.StateIndex(lambda: jnp.zeros(2)),
        ValueError,
        r"`StateIndex\(init\)` takes the initial value of the state itself, not a "
        r"function that creates it",
    ),
    "state-key": (
        lambda: nn.make_with_state(nn.BatchNorm)(2, "batch")[1].get("x"),
        ValueError,
        r"State keys must be `boxwood.nn.StateIndex` objects, got str",
    ),
    "state-set-shape": (
        lambda: _state_set_wrong_shape(),
        ValueError,
        r"`State.set`: the new value must have the same structure, shapes and dtypes "
        r"as the old one",
    ),
    "state-update-type": (
        lambda: nn.make_with_state(nn.BatchNorm)(2, "batch")[1].update(3),
        ValueError,
        r"`State.update` takes a State, got int",
    ),
    # checkpoints
    "save-metadata-type": (
        lambda tmp_path: bw.save(tmp_path / "m.safetensors", [jnp.ones(2)], metadata=3),
        TypeError,
        r"`metadata` must be a dict \(of JSON-serialisable values\), got int",
    ),
    "save-metadata-json": (
        lambda tmp_path: bw.save(
            tmp_path / "m.safetensors", [jnp.ones(2)], metadata={"a": jnp.ones(2)}
        ),
        TypeError,
        r"`metadata` must be JSON-serialisable .* Convert arrays with `.tolist\(\)`",
    ),
    "load-directory-not-orbax": (
        lambda tmp_path: bw.load(_directory(tmp_path / "m"), [jnp.ones(2)]),
        bw.CheckpointError,
        r"m: not a boxwood orbax checkpoint \(a directory with the items `state` and "
        r"`meta`\)",
    ),
    "state-dict-directory": (
        lambda tmp_path: bw.load_state_dict(
            [jnp.ones(2)], os.fspath(_directory(tmp_path / "m.safetensors"))
        ),
        bw.CheckpointError,
        r"m.safetensors: is a directory, not a checkpoint file",
    ),
    "key-map-type": (
        lambda: bw.load_state_dict([jnp.ones(2)], {"0": np.ones(2)}, key_map=3),
        TypeError,
        r"`key_map` must be a dict \(incoming name -> boxwood name\) or a function",
    ),
    "key-map-result": (
        lambda: bw.load_state_dict([jnp.ones(2)], {"0": np.ones(2)}, key_map=len),
        TypeError,
        r"`key_map` must give a string \(or None to drop the entry\) for '0', got 1",
    ),
    # data
    "idx-header": (
        lambda tmp_path: data.read_idx(_idx_file(tmp_path, b"\x01\x02\x03\x04")),
        ValueError,
        r"is not an IDX file \(its header is b'\\x01\\x02\\x03\\x04'\)",
    ),
    "idx-truncated": (
        lambda tmp_path: data.read_idx(
            _idx_file(tmp_path, b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02")
        ),
        ValueError,
        r": the header promises shape \(5,\) of uint8 but the file holds 2 bytes; is "
        r"it truncated\?",
    ),
}


def _directory(path):
    path.mkdir()
    return path


def _traced_twice():
    f = bw.filter_jit(bw.debug.assert_max_traces(lambda x: x, max_traces=1))
    f(jnp.ones(1))
    f(jnp.ones(2))


def _state_set_wrong_shape():
    index = nn.StateIndex(jnp.zeros(2))
    return nn.State([index]).set(index, jnp.zeros(3))


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_a_clear_error(case, tmp_path):
    call, exc, message = CASES[case]
    with pytest.raises(exc, match=message):
        if call.__code__.co_varnames[:1] == ("tmp_path",):
            call(tmp_path)
        else:
            call()


# ---------------------------------------- layers given a badly shaped input
def ones(*shape):
    return jnp.ones(shape)


def _batch_norm(x):
    layer = nn.BatchNorm(4, "batch")
    return jax.vmap(layer, axis_name="batch", in_axes=(0, None))(x, None)


# layer -> (a call with a badly shaped input, the message it must raise)
LAYER_CASES = {
    "Linear": (
        lambda: nn.Linear(3, 4, key=KEY)(ones(5)),
        r"Linear\(in_features=3\): expected input of shape \(3,\), got \(5,\)",
    ),
    "Conv": (
        lambda: nn.Conv(1, 2, 3, 3, key=KEY)(ones(4, 8)),
        r"Conv\(num_spatial_dims=1, in_channels=2\): expected input of shape "
        r"\(2, length\), got \(4, 8\)",
    ),
    "Conv1d": (
        lambda: nn.Conv1d(2, 3, 3, key=KEY)(ones(4, 8)),
        r"Conv1d\(in_channels=2\): expected input of shape \(2, length\), got \(4, 8\)",
    ),
    "Conv2d": (
        lambda: nn.Conv2d(2, 3, 3, key=KEY)(ones(2, 8)),
        r"Conv2d\(in_channels=2\): expected input of shape \(2, height, width\), "
        r"got \(2, 8\)",
    ),
    "Conv3d": (
        lambda: nn.Conv3d(2, 3, 3, key=KEY)(ones(3, 8, 8, 8)),
        r"expected input of shape \(2, depth, height, width\), got \(3, 8, 8, 8\)",
    ),
    "ConvTranspose": (
        lambda: nn.ConvTranspose(1, 2, 3, 3, key=KEY)(ones(4, 8)),
        r"ConvTranspose\(.*\): expected input of shape \(2, length\), got \(4, 8\)",
    ),
    "ConvTranspose1d": (
        lambda: nn.ConvTranspose1d(2, 3, 3, key=KEY)(ones(4, 8)),
        r"ConvTranspose1d\(in_channels=2\): expected input of shape \(2, length\)",
    ),
    "ConvTranspose2d": (
        lambda: nn.ConvTranspose2d(2, 3, 3, key=KEY)(ones(4, 8, 8)),
        r"ConvTranspose2d\(in_channels=2\): expected input of shape "
        r"\(2, height, width\), got \(4, 8, 8\)",
    ),
    "ConvTranspose3d": (
        lambda: nn.ConvTranspose3d(2, 3, 3, key=KEY)(ones(2, 8, 8)),
        r"ConvTranspose3d\(in_channels=2\): expected input of shape "
        r"\(2, depth, height, width\), got \(2, 8, 8\)",
    ),
    "Pool": (
        lambda: nn.Pool(0.0, jax.lax.add, 2, 2)(ones(8, 8)),
        r"Pool\(.*\): expected input of shape \(channels, height, width\), got \(8, 8\)",
    ),
    "MaxPool1d": (
        lambda: nn.MaxPool1d(2)(ones(8)),
        r"MaxPool1d\(kernel_size=\(2,\)\): expected input of shape "
        r"\(channels, length\), got \(8,\)",
    ),
    "MaxPool2d": (
        lambda: nn.MaxPool2d(2)(ones(8, 8)),
        r"MaxPool2d\(kernel_size=\(2, 2\)\): expected input of shape "
        r"\(channels, height, width\), got \(8, 8\)",
    ),
    "MaxPool3d": (
        lambda: nn.MaxPool3d(2)(ones(8, 8, 8)),
        r"MaxPool3d\(.*\): expected input of shape \(channels, depth, height, width\)",
    ),
    "AvgPool1d": (
        lambda: nn.AvgPool1d(2)(ones(8)),
        r"AvgPool1d\(kernel_size=\(2,\)\): expected input of shape \(channels, length\)",
    ),
    "AvgPool2d": (
        lambda: nn.AvgPool2d(2)(ones(8)),
        r"AvgPool2d\(.*\): expected input of shape \(channels, height, width\), got \(8,\)",
    ),
    "AvgPool3d": (
        lambda: nn.AvgPool3d(2)(ones(1, 8, 8)),
        r"AvgPool3d\(.*\): expected input of shape \(channels, depth, height, width\)",
    ),
    "AdaptivePool": (
        lambda: nn.AdaptivePool(2, 1, jnp.max)(ones(8)),
        r"AdaptivePool\(.*\): expected input of shape \(channels, length\), got \(8,\)",
    ),
    "AdaptiveAvgPool1d": (
        lambda: nn.AdaptiveAvgPool1d(2)(ones(8)),
        r"AdaptiveAvgPool1d\(target_shape=\(2,\)\): expected input of shape "
        r"\(channels, length\)",
    ),
    "AdaptiveAvgPool2d": (
        lambda: nn.AdaptiveAvgPool2d(2)(ones(8)),
        r"AdaptiveAvgPool2d\(target_shape=\(2, 2\)\): expected input of shape "
        r"\(channels, height, width\), got \(8,\)",
    ),
    "AdaptiveAvgPool3d": (
        lambda: nn.AdaptiveAvgPool3d(2)(ones(8, 8)),
        r"AdaptiveAvgPool3d\(.*\): expected input of shape "
        r"\(channels, depth, height, width\)",
    ),
    "AdaptiveMaxPool1d": (
        lambda: nn.AdaptiveMaxPool1d(2)(ones(8)),
        r"AdaptiveMaxPool1d\(.*\): expected input of shape \(channels, length\)",
    ),
    "AdaptiveMaxPool2d": (
        lambda: nn.AdaptiveMaxPool2d(2)(ones(8)),
        r"AdaptiveMaxPool2d\(.*\): expected input of shape \(channels, height, width\)",
    ),
    "AdaptiveMaxPool3d": (
        lambda: nn.AdaptiveMaxPool3d(2)(ones(8)),
        r"AdaptiveMaxPool3d\(.*\): expected input of shape "
        r"\(channels, depth, height, width\)",
    ),
    "LayerNorm": (
        lambda: nn.LayerNorm(4)(ones(5)),
        r"LayerNorm\(shape=\(4,\)\): expected input of shape \(4,\), got \(5,\)",
    ),
    "RMSNorm": (
        lambda: nn.RMSNorm(4)(ones(5)),
        r"RMSNorm\(shape=\(4,\)\): expected input of shape \(4,\), got \(5,\)",
    ),
    "GroupNorm": (
        lambda: nn.GroupNorm(2, 4)(ones(6, 3)),
        r"GroupNorm\(groups=2, channels=4\): expected input of shape "
        r"\(4, \*spatial\), got \(6, 3\)",
    ),
    "BatchNorm": (
        lambda: _batch_norm(ones(2, 5)),
        r"BatchNorm\(input_size=4\): expected input of shape \(4, \.\.\.\), got \(5,\)",
    ),
    "Embedding": (
        lambda: nn.Embedding(10, 3, key=KEY)(jnp.array([1, 2])),
        r"Embedding\(num_embeddings=10, embedding_size=3\): expected a scalar index "
        r"of shape \(\), got \(2,\)\. For many indices use `jax.vmap",
    ),
    "MultiheadAttention": (
        lambda: nn.MultiheadAttention(2, 4, key=KEY)(
            ones(3, 5), ones(3, 4), ones(3, 4)
        ),
        r"MultiheadAttention\(num_heads=2, query_size=4\): expected query of shape "
        r"\(q_seq, 4\), got \(3, 5\)",
    ),
    "GRUCell": (
        lambda: nn.GRUCell(3, 4, key=KEY)(ones(3), ones(5)),
        r"GRUCell\(input_size=3, hidden_size=4\): expected hidden of shape \(4,\), "
        r"got \(5,\)",
    ),
    "LSTMCell": (
        lambda: nn.LSTMCell(3, 4, key=KEY)(ones(5), (ones(4), ones(4))),
        r"LSTMCell\(input_size=3, hidden_size=4\): expected input of shape \(3,\), "
        r"got \(5,\)",
    ),
    "RotaryPositionalEmbedding": (
        lambda: nn.RotaryPositionalEmbedding(4)(ones(3, 6)),
        r"RotaryPositionalEmbedding\(embedding_size=4\): expected input of shape "
        r"\(seq_len, 4\), got \(3, 6\)",
    ),
    "MLP": (
        lambda: nn.MLP(3, 2, 8, 2, key=KEY)(ones(4)),
        r"MLP\(in_size=3, out_size=2\): expected input of shape \(3,\), got \(4,\)",
    ),
    "PReLU": (
        lambda: nn.PReLU(jnp.ones(3))(ones(4, 5)),
        r"PReLU\(negative_slope.shape=\(3,\)\): the slope does not broadcast to the "
        r"input of shape \(4, 5\)",
    ),
}

# Classes of boxwood.nn without an input shape of their own, and why.
NO_INPUT_SHAPE = {
    "Dropout": "elementwise: any shape",
    "Identity": "returns its input",
    "Lambda": "calls the user's function",
    "Sequential": "its layers check their inputs",
    "Shared": "calls the user's module",
    "Stacked": "its layer checks the input",
    "SpectralNorm": "the wrapped layer checks the input",
    "WeightNorm": "the wrapped layer checks the input",
    "State": "not a layer",
    "StateIndex": "not a layer",
    "StatefulLayer": "a base class",
    "StaticFunction": "calls the user's function",
}


@pytest.mark.parametrize("name", sorted(LAYER_CASES))
def test_wrong_input_shape_names_layer_expected_and_got(name):
    call, message = LAYER_CASES[name]
    with pytest.raises(ValueError, match=message):
        call()


def test_every_layer_class_has_a_wrong_shape_case():
    classes = {n for n, v in vars(nn).items() if inspect.isclass(v) and n[0] != "_"}
    assert classes - set(LAYER_CASES) - set(NO_INPUT_SHAPE) == set()
    assert set(LAYER_CASES) | set(NO_INPUT_SHAPE) <= classes  # no stale names


def test_dropout_in_training_without_a_key():
    with pytest.raises(
        RuntimeError,
        match=r"Dropout\(p=0.5\) is in training mode \(`inference=False`\) and needs "
        r"a random key: call it as `dropout\(x, key=key\)`",
    ):
        nn.Dropout(0.5)(jnp.ones(3))
