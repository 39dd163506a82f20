import jax
import jax.numpy as jnp
import pytest

import boxwood as bw


class Pair(bw.Module):
    a: object
    b: object


def test_flatten_one_level():
    children, treedef = bw.tree_flatten_one_level({"a": 3, "b": (1, 2)})
    assert children == [3, (1, 2)]
    assert treedef == jax.tree_util.tree_structure({"a": 0, "b": 0})
    assert bw.tree_flatten_one_level(4)[0] == [4]
    children, _ = bw.tree_flatten_one_level(Pair(jnp.ones(1), [1, 2]))
    assert children[1] == [1, 2]
    x: list = []
    x.append(x)
    with pytest.raises(ValueError, match="self-referential"):
        bw.tree_flatten_one_level(x)


def test_tree_check_allows_repeated_leaves_and_empty_nodes():
    a = jnp.ones(2)
    empty: list = []
    bw.tree_check([a, a, 1, 1, None, None, empty, empty, Pair((), ()), [1], [1]])


def test_tree_check_repeated_node_names_paths():
    shared = Pair(jnp.ones(1), 2)
    with pytest.raises(ValueError, match=r"`Pair` at `\['b'\]\[0\]` also appears at"):
        bw.tree_check({"a": shared, "b": [shared]})


def test_tree_check_self_reference():
    x: list = [1]
    x.append({"loop": x})
    with pytest.raises(ValueError, match="contains itself|self-referential"):
        bw.tree_check(x)
