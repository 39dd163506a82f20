"""`save_pretrained(path, max_shard_size=..., dtype=...)`: shards with the index
`transformers` reads, a cast on the way, and no stale files of the other
layout left behind."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import boxwood.models as bm
from _hf_models import transformers
from _tiny_causal_lms import gpt2


def test_sharded_bfloat16_files_load_in_transformers_and_boxwood(tmp_path):
    model = gpt2()
    model.save_pretrained(tmp_path, max_shard_size="20KB", dtype=jnp.bfloat16)
    files = sorted(os.listdir(tmp_path))
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors" not in files
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path))
    wte = np.asarray(model.transformer.wte.weight)
    expected = np.asarray(jnp.asarray(wte, jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(
        theirs.transformer.wte.weight.float().detach().numpy(), expected
    )
    again = bm.from_pretrained(tmp_path)
    assert again.transformer.wte.weight.dtype == jnp.bfloat16
    # saved again in one file: the shards and their index are removed
    model.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [
        "config.json",
        "generation_config.json",  # (a language model's generation defaults)
        "model.safetensors",
    ]


def test_bad_save_options_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"`max_shard_size` must be a number of bytes"):
        gpt2().save_pretrained(tmp_path, max_shard_size="5 parsecs")
    with pytest.raises(TypeError, match=r"`dtype` must be a floating dtype"):
        gpt2().save_pretrained(tmp_path, dtype=jnp.int32)
