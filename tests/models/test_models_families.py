"""Llama 3.x RoPE scaling, Mistral's sliding window and Qwen2 against PyTorch
`transformers`, on tiny random checkpoints written by `save_pretrained`.

The weights are drawn wide (`initializer_range=0.4`) so that activations leave
their linear regime and a wrong formula shows in the logits."""

import functools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

import boxwood
import boxwood.models as bm
from _child_flags import child_env, xla_flags_with_devices
from _hf_models import (
    TOKENS,
    copy_checkpoint,
    scratch_directory,
    token_ids,
    torch,
    transformers,
)
from _precision import tolerance

# One layer (each family's formulas apply in every layer alike), but two where
# the windows differ between layers (`qwen2_window`).
SMALL = dict(
    num_hidden_layers=1,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
    initializer_range=0.4,
    **TOKENS,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
FAMILIES = {
    "llama3": ("LlamaForCausalLM", transformers.LlamaConfig, dict(rope_scaling=LLAMA3)),
    "linear": (
        "LlamaForCausalLM",
        transformers.LlamaConfig,
        dict(rope_scaling={"rope_type": "linear", "factor": 3.0}, rope_theta=50.0),
    ),
    "mistral": (
        "MistralForCausalLM",
        transformers.MistralConfig,
        dict(sliding_window=5, head_dim=8),
    ),
    "qwen2": (
        "Qwen2ForCausalLM",
        transformers.Qwen2Config,
        dict(tie_word_embeddings=True),
    ),
    "gemma": (
        "GemmaForCausalLM",
        transformers.GemmaConfig,
        # The tanh GELU by its own name: a transformers that does not rewrite the
        # legacy "gelu" (5.25 does) builds Gemma's MLP from it as the exact GELU,
        # a few 1e-4 off in the logits (tests/models/test_models_edges.py reads "gelu").
        dict(head_dim=8, hidden_act="gelu_pytorch_tanh"),
    ),
    "qwen2_window": (
        "Qwen2ForCausalLM",
        transformers.Qwen2Config,
        dict(
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            num_hidden_layers=2,
        ),
    ),
}


@boxwood.filter_jit
def _batched(model, ids):
    return jax.vmap(model)(ids)


@boxwood.filter_jit
def _decode(model, ids, state, start):
    return model.decode(ids, state, start)


def save_family(kind, directory, seed=0):
    cls_name, config_cls, options = FAMILIES[kind]
    torch.manual_seed(seed)
    config = config_cls(**{**SMALL, **options})
    reference = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # norms away from their initial ones (Gemma's are 0)
        for name, parameter in reference.named_parameters():
            if "norm" in name:
                parameter.add_(0.5 * torch.randn_like(parameter))
    reference.save_pretrained(str(directory))
    return reference


@functools.cache
def shared_family(kind):
    """`(directory, reference)`: `save_family(kind, ...)`, once per process. Tests
    read the directory, or change a `copy_checkpoint` of it."""
    directory = scratch_directory(kind)
    return directory, save_family(kind, directory)


def changed_family(kind, directory, change):
    """`kind`'s checkpoint in `directory` with `change` applied to its config
    (a "DROP" value removes the option), and the reference of the original."""
    source, reference = shared_family(kind)
    copy_checkpoint(source, directory)
    config = json.loads((directory / "config.json").read_text())
    config = {k: v for k, v in {**config, **change}.items() if v != "DROP"}
    (directory / "config.json").write_text(json.dumps(config))
    return reference


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request):
    directory, reference = shared_family(request.param)
    return request.param, bm.from_pretrained(directory), reference


def _relative_error(out, expected):
    return np.abs(np.asarray(out) - expected).max() / np.abs(expected).max()


# relative, float32 at `highest` precision; a TPU's `tanh` (Gemma's GELU) and
# its float32 products differ from the CPU's by more (2.2e-5 measured for Gemma)
LOGITS_TOLERANCE = tolerance(cpu=2e-5, accelerator=1e-4)

# Longer than the sliding windows and than llama3's original context.
LOGITS_IDS = token_ids(1, (2, 40))
_LOGITS = {}


def _logits(kind, model):
    """`model`'s logits for `LOGITS_IDS`, computed once per family."""
    if kind not in _LOGITS:
        with jax.default_matmul_precision("highest"):
            _LOGITS[kind] = _batched(model, jnp.asarray(LOGITS_IDS))
    return _LOGITS[kind]


def test_logits_match_transformers(pair):
    kind, model, reference = pair
    assert type(model).__name__ == type(reference).__name__
    ids = LOGITS_IDS
    out = _logits(kind, model)
    with torch.no_grad():
        expected = reference(torch.tensor(ids)).logits.numpy()
    assert _relative_error(out, expected) <= LOGITS_TOLERANCE, kind


def test_greedy_generate_matches_transformers(pair):
    kind, model, reference = pair
    for seed, length in [(0, 3), (1, 11)]:
        ids = token_ids(seed, (length,))
        with jax.default_matmul_precision("highest"):
            out = bm.generate(model, jnp.asarray(ids), 24, eos_token_id=None)
        with torch.no_grad():
            expected = reference.generate(
                torch.tensor(ids)[None], max_new_tokens=24, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )[0].numpy()  # fmt: skip
        np.testing.assert_array_equal(np.asarray(out), expected, err_msg=kind)
    assert len(set(np.asarray(out)[length:].tolist())) > 3


def test_cache_steps_equal_full_forward(pair):
    kind, model, _ = pair
    ids = jnp.asarray(LOGITS_IDS[0, :12])
    # a causal model: the first 12 positions of the longer forward pass
    full = _logits(kind, model)[0, :12]
    with jax.default_matmul_precision("highest"):
        head, state = _decode(model, ids[:6], model.init_cache(16), 0)
        rest = []
        for i in range(6, 12):
            logits, state = _decode(model, ids[i : i + 1], state, jnp.int32(i))
            rest.append(logits[0])
    stepped = jnp.concatenate([head, jnp.stack(rest)])
    assert np.abs(np.asarray(stepped) - np.asarray(full)).max() <= 1e-4


def test_structure_of_each_family(pair):
    kind, model, _ = pair
    attn = model.model.layers.layers.self_attn  # stacked (no leaf sliced)
    if kind.startswith("qwen2"):
        assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    if kind == "qwen2":
        assert model.lm_head is None
        assert model.model.windows == (None,)
    if kind == "qwen2_window":  # layers from `max_window_layers` on slide
        assert model.model.windows == (None, 4)
    if kind == "mistral":
        assert model.model.windows == (5,) and attn.q_proj.bias is None
    if kind == "gemma":
        assert model.lm_head is None and model.model.embed_scale == 32**0.5
        assert model.config.hidden_act == "gelu_pytorch_tanh"
    if kind == "llama3":
        assert dict(model.config.rope_scaling)["rope_type"] == "llama3"


def test_round_trip_through_save_pretrained(pair, tmp_path):
    kind, model, reference = pair
    bm.save_pretrained(model, tmp_path)
    again = bm.from_pretrained(tmp_path)
    assert again.config == model.config
    loaded = type(reference).from_pretrained(str(tmp_path)).eval()
    ids = token_ids(4, (1, 20))
    with torch.no_grad():
        a = loaded(torch.tensor(ids)).logits.numpy()
        b = reference(torch.tensor(ids)).logits.numpy()
    np.testing.assert_array_equal(a, b, err_msg=kind)


def test_wrong_rope_formula_would_fail(tmp_path):
    """The llama3 checkpoint is sensitive to its scaling: computed without it,
    the logits are far off."""
    default = {"rope_type": "default", "rope_theta": 10000.0}
    reference = changed_family("llama3", tmp_path, {"rope_parameters": default})
    model = bm.from_pretrained(tmp_path)
    ids = token_ids(1, (1, 40))
    out = _batched(model, jnp.asarray(ids))
    with torch.no_grad():
        expected = reference(torch.tensor(ids)).logits.numpy()
    assert _relative_error(out, expected) > 1e-2


@pytest.mark.parametrize(
    "kind, change",
    [
        ("mistral", {"sliding_window": None}),
        ("qwen2_window", {"use_sliding_window": False}),
        ("qwen2", {"rope_parameters": {"rope_type": "linear", "factor": 1.5}}),
        # read as a Llama: no embedding scale, `weight` rather than `1 + weight`
        ("gemma", {"model_type": "llama", "use_bidirectional_attention": "DROP"}),
    ],
)
def test_window_and_scaling_matter(kind, change, tmp_path):
    """Each checkpoint is sensitive to the option under test: with it changed,
    boxwood's logits (loaded from the changed config) are far from the
    reference's, so the exactness tests above can fail."""
    reference = changed_family(kind, tmp_path, change)
    model = bm.from_pretrained(tmp_path)
    ids = token_ids(1, (1, 40))
    out = _batched(model, jnp.asarray(ids))
    with torch.no_grad():
        expected = reference(torch.tensor(ids)).logits.numpy()
    assert _relative_error(out, expected) > 1e-2


def test_legacy_rope_scaling_spelling():
    config = bm.LlamaConfig.from_dict(
        {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == (("factor", 2.0), ("rope_type", "linear"))
    assert config.to_dict()["rope_parameters"] == {
        "rope_type": "linear",
        "rope_theta": 500000.0,
        "factor": 2.0,
    }
    direct = bm.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert direct.rope_scaling == config.rope_scaling
    assert bm.LlamaConfig.from_dict({"rope_scaling": None}).rope_scaling is None


def test_unsupported_rope_and_window_options_are_named():
    with pytest.raises(bm.ConfigError, match="`rope_type` = 'yarn' is not supported"):
        bm.LlamaConfig.from_dict({"rope_parameters": {"rope_type": "yarn"}})
    with pytest.raises(
        bm.ConfigError, match="`rope_type` = 'longrope' is not supported"
    ):
        bm.LlamaConfig.from_dict(
            {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}
        )
    with pytest.raises(
        bm.ConfigError, match="the key `attention_factor` .* for `rope_type` = 'linear'"
    ):
        bm.LlamaConfig.from_dict(
            {
                "rope_parameters": {
                    "rope_type": "linear",
                    "factor": 2.0,
                    "attention_factor": 1.5,
                }
            }
        )
    with pytest.raises(bm.ConfigError, match="'llama3' needs low_freq_factor"):
        bm.LlamaConfig.from_dict(
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 16}}
        )  # fmt: skip
    with pytest.raises(
        bm.ConfigError, match="both `rope_parameters` and `rope_scaling`"
    ):
        bm.LlamaConfig.from_dict({"rope_parameters": {}, "rope_scaling": {}})
    with pytest.raises(
        bm.ConfigError,
        match="`sliding_window` = 8 is not supported.*MistralForCausalLM",
    ):
        bm.LlamaConfig.from_dict({"model_type": "mistral", "sliding_window": 8})
    with pytest.raises(bm.ConfigError, match="`sliding_window` must be a positive int"):
        bm.MistralConfig.from_dict({"sliding_window": 0})
    with pytest.raises(
        bm.ConfigError, match="`attention_bias` = True is not supported"
    ):
        bm.Qwen2Config.from_dict({"attention_bias": True})
    with pytest.raises(bm.ConfigError, match="`use_mrope` = True is not supported"):
        bm.Qwen2Config.from_dict({"use_mrope": True})
    with pytest.raises(bm.ConfigError, match="`layer_types` must list 2 entries"):
        bm.Qwen2Config.from_dict(
            {"num_hidden_layers": 2, "layer_types": ["full_attention"]}
        )
    with pytest.raises(
        bm.ConfigError, match=r"the option `new_thing` \(= 1\) is not supported"
    ):
        bm.Qwen2Config.from_dict({"new_thing": 1})
    with pytest.raises(
        bm.ConfigError, match="`hidden_activation` = 'silu' is not supported"
    ):
        bm.GemmaConfig.from_dict({"hidden_activation": "silu"})
    with pytest.raises(
        bm.ConfigError, match="`use_bidirectional_attention` = True is not supported"
    ):
        bm.GemmaConfig.from_dict({"use_bidirectional_attention": True})
    with pytest.raises(bm.ConfigError, match="reads 'mistral'"):
        bm.MistralConfig.from_dict({"model_type": "llama"})


SHARDED_SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import boxwood, boxwood.models as bm
from jax.sharding import PartitionSpec as P

assert jax.device_count() == 8
mesh = boxwood.make_mesh((2, 4), ("data", "model"))


def split_over(model, axis):
    # the paths of the leaves whose sharding splits them over `axis`
    leaves = jax.tree_util.tree_leaves_with_path(model)
    return [jax.tree_util.keystr(p) for p, x in leaves if axis in str(x.sharding.spec)]


for path, expected in zip(sys.argv[1::2], sys.argv[2::2]):
    expected = np.load(expected)
    model = bm.from_pretrained(path, mesh=mesh, rules="tensor_parallel")
    attn = model.model.layers.layers.self_attn  # stacked: leading `layer` axis
    assert attn.q_proj.weight.sharding.spec == P(None, "model", None), path
    assert attn.o_proj.weight.sharding.spec == P(None, None, "model"), path
    if attn.q_proj.bias is not None:
        assert attn.q_proj.bias.sharding.spec == P(None, "model"), path
    assert len(split_over(model, "model")) >= 4 * 2, path  # q, k, v, o, MLP
    for leaf in jax.tree_util.tree_leaves(model):
        assert len(leaf.sharding.device_set) == 8, path  # placed, not on one device
    batch = jnp.asarray(expected["batch"])
    with jax.default_matmul_precision("highest"):
        out = boxwood.filter_jit(jax.vmap(model))(boxwood.shard_batch(batch, mesh))
        # what `transformers` computes, to the unsharded model's tolerance
        logits = expected["logits"]
        error = np.abs(np.asarray(out) - logits).max() / np.abs(logits).max()
        assert error <= 2e-5, (path, error)
        np.testing.assert_array_equal(
            np.asarray(bm.generate(model, batch[0, :7], 12, eos_token_id=None)), expected["greedy"]
        )
    fsdp = bm.from_pretrained(path, mesh=mesh, rules="fsdp")
    assert fsdp.model.embed_tokens.weight.sharding.spec == P(None, "data"), path
    assert split_over(fsdp, "data"), path
    print("SHARDED", path)
print("FAMILIES-SHARDED-OK")
"""


def test_sharded_load_and_generate_on_8_devices(tmp_path):
    """Tensor-parallel and FSDP loads of the Llama family (one checkpoint of each
    class) straight into their shardings on 8 simulated devices compute what
    `transformers` computes: logits, and greedy tokens equal to its `generate`
    (the unsharded models are held to the same in the tests above)."""
    kinds = ("llama3", "mistral", "qwen2_window", "gemma")
    ids = np.arange(3, 35) % 90 + 3
    batch = np.stack([ids, ids[::-1]])
    arguments = []
    for kind in kinds:
        directory, reference = shared_family(kind)
        with torch.no_grad():
            logits = reference(torch.tensor(batch)).logits.numpy()
            greedy = reference.generate(
                torch.tensor(ids[:7])[None], max_new_tokens=12, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )[0].numpy()  # fmt: skip
        expected = tmp_path / f"{kind}.npz"
        np.savez(expected, batch=batch, logits=logits, greedy=greedy)
        arguments += [str(directory), str(expected)]
    env = child_env(XLA_FLAGS=xla_flags_with_devices(8))
    out = subprocess.run(
        [sys.executable, "-c", SHARDED_SCRIPT, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "FAMILIES-SHARDED-OK" in out.stdout, out.stderr[-3000:]
    assert out.stdout.count("SHARDED ") == len(kinds)


@pytest.mark.parametrize(
    "cls, config",
    [
        (
            bm.MistralForCausalLM,
            bm.MistralConfig(16, 16, 32, 1, 4, 2, sliding_window=4),
        ),
        (bm.Qwen2ForCausalLM, bm.Qwen2Config(16, 16, 32, 1, 4, 2)),
        (bm.GemmaForCausalLM, bm.GemmaConfig(16, 16, 32, 1, 4, 2, 4)),
    ],
)
def test_tensor_parallel_rules_cover_new_families(cls, config):
    assert bm.sharding_rules(cls) == bm.sharding_rules(bm.LlamaForCausalLM)
    abstract = boxwood.filter_eval_shape(cls, config, key=jax.random.key(0))
    mesh = AbstractMesh((2, 4), ("data", "model"))
    plan = boxwood.sharding_plan(abstract, mesh, bm.sharding_rules(cls), show=False)
    specs = {row.path: str(row.spec) for row in plan.rows}
    projections = [p for p in specs if "_proj" in p or "lm_head" in p]
    assert projections and all("model" in specs[p] for p in projections), specs
