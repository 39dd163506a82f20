"""Loading one checkpoint twice (or building a model twice) gives models of equal
structure, so compiled code (`generate`'s included) is reused, not compiled again."""

import jax
import jax.numpy as jnp

import boxwood
import boxwood.models as bm
from _hf_models import shared_tiny, token_ids
from boxwood.models._generate import _decode


def test_two_loads_share_structure_and_compiled_code():
    directory, _ = shared_tiny("gpt2")
    first, second = bm.from_pretrained(directory), bm.from_pretrained(directory)
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)
    assert bool(boxwood.tree_equal(first, second))
    ids = jnp.asarray(token_ids(0, (5,)))
    out = bm.generate(first, ids, 3)
    traces = _decode.cache_info().traces
    assert (bm.generate(second, ids, 3) == out).all()
    assert _decode.cache_info().traces == traces


def test_two_builds_from_one_config_share_structure():
    directory, _ = shared_tiny("llama", num_key_value_heads=2)
    loaded = bm.from_pretrained(directory)
    cls = type(loaded)
    # built in training mode, loaded in inference mode: compared in one mode
    first = boxwood.nn.inference_mode(cls(loaded.config, key=jax.random.key(0)))
    second = boxwood.nn.inference_mode(cls(loaded.config, key=jax.random.key(1)))
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(loaded)
    forward = boxwood.filter_jit(lambda model, ids: model(ids))
    ids = jnp.asarray(token_ids(1, (4,)))
    forward(first, ids)
    traces = forward.cache_info().traces
    forward(second, ids)
    assert forward.cache_info().traces == traces
