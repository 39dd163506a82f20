"""Error messages quoted in the docs are the real ones: each quote below is found in
its page as written, then the error is raised and its text compared with the quote.

A quote matches when it is the start of `Class: message` (the whole of it where the
docs quote the whole message, any part where they quote a part), with `...` (or `…`) standing for any text and runs
of white space (a quote wrapped over lines) equal to one space. The static side, a
catalogue row for every error the source builds, is tests/errors/test_error_catalogue.py.
"""

import dataclasses
import importlib.util
import re
import sys
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import boxwood as bw
from _markdown_blocks import ROOT
from boxwood import nn


def _squash(text: str) -> str:
    return " ".join(text.split())


def quote_pattern(quote: str, whole: bool) -> re.Pattern:
    pieces = re.split(r"\.\.\.|…", _squash(quote))
    body = ".*?".join(re.escape(p) for p in pieces)
    return re.compile(body + ("" if not whole else r"\Z"), re.S)


def matches(
    quote: str, error: BaseException, whole: bool, stand_ins: dict, part: bool = False
) -> bool:
    text = str(error)
    for real, shown in stand_ins.items():
        text = text.replace(real, shown)
    pattern = quote_pattern(quote, whole)
    names = {type(error).__name__, f"{type(error).__module__}.{type(error).__name__}"}
    names.add("boxwood." + type(error).__name__)
    candidates = [_squash(text)] + [_squash(f"{n}: {text}") for n in names]
    find = pattern.search if part else pattern.match
    return any(find(c) for c in candidates)


@dataclasses.dataclass
class Quote:
    page: str
    quote: str
    raise_it: Callable  # (tmp_path) -> raises the error
    whole: bool = False  # the docs quote the whole message
    part: bool = False  # the docs quote a part from the middle
    stand_ins: Callable = lambda tmp_path: {}  # real text -> the docs' stand-in


def _linear_shape(tmp_path):
    nn.Linear(3, 4, key=jax.random.key(0))(jnp.ones(5))


def _restore_empty(tmp_path):
    bw.Checkpointer(tmp_path / "runs").restore(1)


def _load_mismatch(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    bw.save(
        path,
        {
            "encoder": {"weight": jnp.zeros((64, 32))},
            "decoder": {"scale": jnp.zeros(())},
        },
    )
    like = {"encoder": {"weight": jnp.zeros((64, 16)), "bias": jnp.zeros(64)}}
    bw.load(path, like)


def _load_two_problems(tmp_path):
    bw.save(tmp_path / "model.safetensors", {"w": jnp.zeros(3)})
    bw.load(tmp_path / "model.safetensors", {"w": jnp.zeros(4), "b": jnp.zeros(2)})


def _rule_does_not_fit(tmp_path):
    mesh = AbstractMesh((8,), ("data",))
    bw.sharding_plan({"w": jnp.zeros((4, 3))}, mesh, [("w", P(None, "data"))])


def _unhashable_argument(tmp_path):
    @dataclasses.dataclass  # a dataclass with eq=True is unhashable
    class Config:
        sizes: list

    @dataclasses.dataclass
    class Settings:
        config: Config

    bw.filter_jit(lambda x, settings: x)(jnp.ones(1), Settings(Config([32, 32])))


def _array_in_static_field(tmp_path):
    class Block(bw.Module):
        table: object = bw.field(static=True)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Block(jnp.ones(2))


def _error_if_in_filter_jit(tmp_path):
    @bw.filter_jit
    def f(x):
        return bw.error_if(x, x > 0, "x must not be positive")

    f(jnp.ones(2))


y = jnp.zeros((4, 1))  # a global array read inside a method (docs/filter_jit.md)


class Affine(bw.Module):
    w: jax.Array

    def __call__(self, v):
        return v @ self.w + y


def _method_reads_a_global(tmp_path):
    """A module argument whose class comes from another file (a `layers.py` next
    to the notebook): what its method reads from that file's globals is keyed,
    and the explanation of the next trace names it with its file."""
    source = (
        "import jax.numpy as jnp\nimport boxwood as bw\ny = jnp.ones(3)\n\n"
        "class Model(bw.Module):\n    def __call__(self, v):\n        return v * y\n"
    )
    path = tmp_path / "layers.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("layers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import leaves it
    try:
        spec.loader.exec_module(module)

        def step(model, v):
            return model(v)

        compiled = bw.filter_jit(step, explain=True)
        compiled(module.Model(), jnp.ones(3))
        module.y = jnp.zeros(3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled(module.Model(), jnp.ones(3))
    finally:
        del sys.modules[spec.name]


QUOTES = [
    Quote("docs/layers.md", "Linear(in_features=3): expected input of shape (3,), got (5,).", _linear_shape, whole=True),
    Quote("docs/errors.md", "ValueError: Layer(...): expected input of shape (3,), got (5,)", _linear_shape,
          stand_ins=lambda tmp_path: {"Linear(": "Layer("}),
    Quote(
        "docs/errors.md",
        "boxwood.CheckpointError: directory: no checkpoint to restore (no complete step_*.safetensors file or step_* directory). Check `latest_step()` first.",
        _restore_empty, whole=True,
        stand_ins=lambda tmp_path: {str(tmp_path / "runs"): "directory"},
    ),
    Quote(
        "docs/checkpoints.md",
        """boxwood.CheckpointError: Cannot load the checkpoint ckpt.safetensors into the given tree (3 problems):
  - encoder.bias: missing from the file
  - decoder.scale: in the file but not in the model
  - encoder.weight: file has f32[64,32], model expects f32[64,16]
The file was saved from a tree of a different structure (...)""",
        _load_mismatch,
        stand_ins=lambda tmp_path: {str(tmp_path / "ckpt.safetensors"): "ckpt.safetensors"},
    ),
    Quote(
        "docs/errors.md",
        """boxwood.CheckpointError: Cannot load the checkpoint model.safetensors into the given tree (2 problems):
  - b: missing from the file
  - w: file has f32[3], model expects f32[4]""",
        _load_two_problems,
        stand_ins=lambda tmp_path: {str(tmp_path / "model.safetensors"): "model.safetensors"},
    ),
    Quote(
        "docs/scaling-out.md",
        """ValueError: Sharding rule rules[0] = ('w', P(None, 'data')) does not fit leaf `w` of
shape (4, 3) (spec P(None, 'data')): dimension 1 (size 3) is not divisible by 8, the
size of mesh axes ('data',); pick a dimension or a mesh axis that divides it, or
replicate this leaf with an earlier rule.""",
        _rule_does_not_fit, whole=True,
    ),
    Quote("docs/errors.md", "TypeError: `filter_jit`: the non-array value at `args[1].config.sizes` (of type list) is not hashable", _unhashable_argument),
    Quote("docs/filter_jit.md", "the non-array value at `args[1].config.sizes` (of type list) is not hashable", _unhashable_argument, part=True),
    Quote(
        "docs/filter_jit.md",
        """filter_jit(step) is recompiling (trace 2; 1 earlier signature(s)). Compared with the closest earlier call:
  global 'layers.y': an array float32[3] -> an array float32[3] (definition 2)""",
        _method_reads_a_global, whole=True,
        stand_ins=lambda tmp_path: {"_method_reads_a_global.<locals>.step": "step"},
    ),
    Quote("docs/concepts.md", "`Block.table` is a static field but holds an array", _array_in_static_field, part=True),
    Quote("docs/errors.md", "ValueError: summary: `max_rows` must be a positive int", lambda t: bw.summary([], max_rows=0)),
    Quote("docs/errors.md", "TypeError: summary: `check_finite` must be True or False", lambda t: bw.summary([], check_finite=1)),
    Quote("docs/errors.md", "TypeError: split_keys: `num` must be an int, got ...", lambda t: bw.random.split_keys(jax.random.key(0), 2.5)),
    Quote("docs/errors.md", "ValueError: `Dropout.p` must be in [0, 1]", lambda t: nn.Dropout(p=2.0)),
    Quote("docs/errors.md", "ValueError: `tree_at` takes exactly one of `replace=` or `replace_fn=`", lambda t: bw.tree_at(lambda m: m, 1)),
    Quote("docs/errors.md", "TypeError: inference_mode: `value` must be a Python bool", lambda t: nn.inference_mode(nn.Dropout(0.1), jnp.array(True))),
    Quote("docs/errors.md", "boxwood.BoxwoodRuntimeError: <your message>", _error_if_in_filter_jit,
          stand_ins=lambda tmp_path: {"x must not be positive": "<your message>"}),
    Quote("docs/migrating-from-equinox.md", "BoxwoodRuntimeError: <your message>", _error_if_in_filter_jit,
          stand_ins=lambda tmp_path: {"x must not be positive": "<your message>"}),
]  # fmt: skip


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.page}:{q.quote[:40]}")
def test_a_quoted_message_is_the_real_one(quote, tmp_path):
    page = _squash((ROOT / quote.page).read_text())
    assert _squash(quote.quote) in page, "the page no longer quotes this"
    with pytest.raises(Exception) as info:
        quote.raise_it(tmp_path)
    stand_ins = quote.stand_ins(tmp_path)
    assert matches(quote.quote, info.value, quote.whole, stand_ins, quote.part), (
        f"{quote.page} quotes\n  {quote.quote}\nbut the error is\n  "
        f"{type(info.value).__name__}: {info.value}"
    )


def test_the_demo_error_line_in_getting_started_is_the_real_one(capsys, tmp_path):
    from boxwood.demo import main

    line = "boxwood-demo: error: argument --batch-size: must be at least 1, got 0"
    assert line in (ROOT / "docs" / "getting-started.md").read_text()
    with pytest.raises(SystemExit):
        main(["--batch-size", "0", "--out", str(tmp_path)])
    assert capsys.readouterr().err.splitlines()[0].startswith(line)


def test_a_quote_that_differs_from_the_message_does_not_match():
    error = ValueError("Linear(in_features=3): expected input of shape (3,), got (5,).")
    old = (
        "Linear(in_features=3, out_features=4): expected input of shape (3,), got (5,)"
    )
    assert not matches(old, error, False, {})
    assert matches("ValueError: Linear(...): expected input ...", error, False, {})
    assert not matches("Linear(in_features=3): expected input", error, True, {})
    short = bw.CheckpointError("d: no checkpoint to restore (no complete x or y).")
    assert not matches(
        "CheckpointError: d: no checkpoint to restore (no complete x)", short, False, {}
    )
