"""The HTML display of a `boxwood.models` model: the key/value cache's `StateIndex`
markers and object addresses hidden, the config's fields shown whole."""

import re

import jax
import jax.numpy as jnp
import pytest

import boxwood
import boxwood.models as bm
from boxwood import nn

CONFIG = bm.GPT2Config(
    n_layer=2, n_embd=16, n_head=4, vocab_size=10, n_positions=8, bos_token_id=1
)
ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


@pytest.fixture(scope="module")
def gpt2():
    return bm.GPT2LMHeadModel(CONFIG, key=jax.random.key(0))


@pytest.fixture(scope="module")
def gpt2_html(gpt2):
    return gpt2._repr_html_()


def test_cache_indices_show_without_their_markers(gpt2, gpt2_html):
    def is_index(x):
        return isinstance(x, nn.StateIndex)

    leaves = jax.tree_util.tree_leaves(gpt2, is_leaf=is_index)
    indices = [x for x in leaves if is_index(x)]
    assert indices  # the key/value cache's
    shown = gpt2_html.count('cache: <span class="bw-cls">StateIndex</span>')
    assert shown == len(indices)
    assert "marker" not in gpt2_html
    assert ".attn.cache" not in gpt2_html  # the marker's text
    assert "init: None" not in gpt2_html
    assert not ADDRESS.search(gpt2_html)


def test_config_fields_are_all_shown_architecture_first(gpt2_html):
    for field, value in [("n_embd", 16), ("n_layer", 2), ("n_head", 4)]:
        assert f'{field} = <span class="bw-static">{value}</span>' in gpt2_html
    # the token ids (keyword-only fields) come after the architecture's fields
    assert gpt2_html.index("n_layer = ") < gpt2_html.index("bos_token_id = ")
    assert 'bos_token_id = <span class="bw-static">1</span>' in gpt2_html
    head = re.search(r"config = <span class=\"bw-static\">(.*?)</span>", gpt2_html)
    assert head is not None and head.group(1).startswith(
        "GPT2Config(vocab_size=10, n_positions=8, n_embd=16, n_layer=2, n_head=4"
    )


def test_ignored_options_are_shown_with_the_config():
    config = bm.GPT2Config.from_dict({"n_embd": 16, "n_head": 4, "n_ctx": 25})
    model = boxwood.filter_eval_shape(bm.GPT2LMHeadModel, config, key=jax.random.key(0))
    html = boxwood._display.module_html(model)
    assert (
        'extra = <span class="bw-static">IgnoredOptions({&#x27;n_ctx&#x27;: 25})'
        in html
    )


class _Opaque:
    pass


class _Counter(boxwood.Module):
    index: nn.StateIndex
    thing: object = boxwood.field(static=True)

    def __init__(self):
        self.index = nn.StateIndex(jnp.zeros(3))
        self.thing = _Opaque()


def test_any_module_shows_state_initial_values_and_no_addresses():
    html = _Counter()._repr_html_()
    assert "init: " in html and "f32[3]" in html  # an index with a value shows it
    assert "marker" not in html
    assert "&lt;test_models_display._Opaque&gt;" in html
    assert not ADDRESS.search(html)


def test_treescope_hides_markers_too():
    treescope = pytest.importorskip("treescope")
    text = treescope.render_to_text(_Counter())
    assert "StateIndex(" in text and "marker" not in text
