"""`from_pretrained` reads its weights in one pass: every file tensor read once,
straight into its place, each stacked leaf assembled once from the plan
`boxwood.models` hands `boxwood._checkpoint.assemble`, and the options checked
as before."""

import jax
import numpy as np
import pytest

import boxwood.models as bm
from _safetensors_rewrite import rewrite_with_8_byte_padding
from boxwood._checkpoint import _parts, _safetensors, read_tensors

CONFIG = bm.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=3, n_head=2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = bm.GPT2LMHeadModel(CONFIG, key=jax.random.key(0))
    path = tmp_path_factory.mktemp("gpt2")
    bm.save_pretrained(model, path)
    rewrite_with_8_byte_padding(path / "model.safetensors")  # nothing mapped
    return model, path


def _counted(monkeypatch, cls, method):
    calls = []
    real = getattr(cls, method)

    def count(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, count)
    return calls


def test_each_tensor_is_read_once_and_each_stack_assembled_once(saved, monkeypatch):
    model, path = saved
    stacks = _counted(monkeypatch, _parts.PartsTensor, "read")
    into = _counted(monkeypatch, _safetensors.FileTensor, "read_into")
    whole = _counted(monkeypatch, _safetensors.FileTensor, "read")
    loaded = bm.from_pretrained(path)
    stacked = jax.tree.leaves(model.transformer.h.layers)
    assert len(stacks) == len(stacked)  # each stacked leaf once
    assert {len(s.parts) for s in stacks} == {CONFIG.n_layer}
    # every layer of a stack read straight into its row, every other tensor
    # read as a whole (into a buffer of its own), and no tensor twice
    layers = {id(p) for s in stacks for p in s.parts}
    others = {id(t) for t in whole}
    assert len(layers) == len(stacked) * CONFIG.n_layer and not layers & others
    assert sorted(map(id, into)) == sorted(layers | others)
    assert len(whole) == len(others)
    assert len(into) == len(read_tensors(path / "model.safetensors"))
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(model)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_strategy_name_is_checked_without_a_mesh(saved):
    _, path = saved
    with pytest.raises(ValueError, match="`strategy` must be 'data_parallel'"):
        bm.from_pretrained(path, rules="pipeline")
