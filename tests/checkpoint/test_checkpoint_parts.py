"""A leaf stored as one tensor per layer (`boxwood._checkpoint.assemble(...,
parts=...)`): every part validated in the one pass (problems name the part),
then the leaf read once: whole, by device shard, cast, reshaped, kept where a
non-strict source lacks a part, and as one view of a file where its parts lie
back to back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
from boxwood._checkpoint import (
    ArrayTensor,
    CheckpointError,
    Part,
    assemble,
    read_tensors,
    write_file,
)
from boxwood._checkpoint._parts import PartsTensor

LAYERS = [np.arange(12, dtype=np.float16).reshape(3, 4) + 100 * i for i in range(4)]


def _parts(depth, name="w", leaf="stack"):
    return {f"{name}.{i}": Part(leaf, (i,)) for i in range(depth)}


def _source(layers=LAYERS):
    return {f"w.{i}": ArrayTensor(a) for i, a in enumerate(layers)}


def test_parts_are_read_into_one_buffer_cast_and_reshaped():
    like = {"stack": jax.ShapeDtypeStruct((4, 3, 4), jnp.float32)}
    source = _source()
    source["w.3"] = ArrayTensor(LAYERS[3].reshape(1, 3, 4))  # a unit axis more
    tree, report = assemble(
        like, source, strict=True, cast=jnp.float32, squeeze_ok=True, parts=_parts(4)
    )
    assert tree["stack"].dtype == jnp.float32
    np.testing.assert_array_equal(tree["stack"], np.stack(LAYERS))
    assert report.missing_keys == report.unexpected_keys == []


def test_nested_parts_read_whole_and_by_device_shard():
    parts = {f"w.{i}": Part("stack", divmod(i, 2)) for i in range(4)}
    like = {"stack": jax.ShapeDtypeStruct((2, 2, 3, 4), jnp.float16)}
    want = np.stack(LAYERS).reshape(2, 2, 3, 4)
    tree, _ = assemble(like, _source(), strict=True, parts=parts)
    np.testing.assert_array_equal(tree["stack"], want)
    # a device's shard (`jax.make_array_from_callback` asks for a block): only
    # the layers it covers are read, each only in part, cast on the way
    rows = tuple(ArrayTensor(a) for a in LAYERS[:3]) + (
        ArrayTensor(LAYERS[3].reshape(1, 3, 4)),
    )
    stack = PartsTensor(rows, (2, 2, 3, 4), np.dtype(np.float32), 2)
    index = (slice(1, 2), slice(0, 2), slice(0, 1), slice(None))
    block = stack.read(index)
    assert block.dtype == np.float32 and block.ctypes.data % 64 == 0
    np.testing.assert_array_equal(block, want[index])


def test_every_part_is_validated_and_named_in_one_error():
    like = {"stack": jax.ShapeDtypeStruct((4, 3, 4), jnp.float16), "b": jnp.zeros(2)}
    source = _source(LAYERS[:2] + [np.zeros((3, 5), np.float16)])
    source["extra"] = ArrayTensor(np.zeros(1, np.float32))
    with pytest.raises(CheckpointError) as info:
        assemble(like, source, strict=True, parts=_parts(4), where="the file")
    assert info.value.problems == [
        "w.3: missing from the file",
        "b: missing from the file",
        "extra: in the file but not in the model",
        "w.2: file has f16[3,5], model expects f16[3,4]",
    ]


def test_parts_that_do_not_cover_the_leaf_are_a_problem():
    like = {"stack": jax.ShapeDtypeStruct((4, 3, 4), jnp.float16)}
    parts = _parts(4)
    parts["w.3"] = Part("stack", (2,))  # two tensors for layer 2, none for 3
    with pytest.raises(
        CheckpointError,
        match=r"stack: the tensors named for it are not one for each index of its "
        r"leading axes \(4,\)",
    ):
        assemble(like, _source(), strict=True, parts=parts)


def test_a_non_strict_load_keeps_the_layers_it_lacks():
    like = {"stack": jnp.full((4, 3, 4), -1.0, jnp.float16)}
    tree, report = assemble(like, _source(LAYERS[:3]), strict=False, parts=_parts(4))
    assert report.missing_keys == ["w.3"]
    np.testing.assert_array_equal(tree["stack"][:3], np.stack(LAYERS[:3]))
    np.testing.assert_array_equal(tree["stack"][3], -np.ones((3, 4)))
    abstract = {"stack": jax.ShapeDtypeStruct((4, 3, 4), jnp.float16)}
    with pytest.raises(CheckpointError, match="w.3: missing from the file, and"):
        assemble(abstract, _source(LAYERS[:3]), strict=False, parts=_parts(4))


@pytest.mark.usefixtures("host_arrays")  # a view of the file in host memory
def test_parts_back_to_back_in_a_file_are_one_view_of_it(tmp_path):
    path = tmp_path / "layers.safetensors"
    write_file(path, [(f"w.{i}", a) for i, a in enumerate(LAYERS)], {})
    like = {"stack": jax.ShapeDtypeStruct((4, 3, 4), jnp.float16)}
    tensors = read_tensors(path, zero_copy=True)
    tree, _ = assemble(like, tensors, strict=True, parts=_parts(4))
    np.testing.assert_array_equal(tree["stack"], np.stack(LAYERS))
    mapped = np.frombuffer(tensors["w.0"].mapping.data(), np.uint8).ctypes.data
    pointer = tree["stack"].unsafe_buffer_pointer()
    assert mapped <= pointer < mapped + tensors["w.0"].mapping.data().size
    # out of order, the layers are copied into a buffer of the process's own
    shuffled = {f"w.{i}": tensors[f"w.{3 - i}"] for i in range(4)}
    tree, _ = assemble(like, shuffled, strict=True, parts=_parts(4))
    np.testing.assert_array_equal(tree["stack"], np.stack(LAYERS[::-1]))
    pointer = tree["stack"].unsafe_buffer_pointer()
    assert not mapped <= pointer < mapped + tensors["w.0"].mapping.data().size
    assert bool(boxwood.tree_equal(tree["stack"][0], jnp.asarray(LAYERS[3])))
