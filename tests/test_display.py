"""`Module._repr_html_`, `boxwood.summary` and the treescope rendering."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood as bw
from boxwood import nn
from boxwood._display import FOLD_AT, FOLD_HEAD, module_html
from boxwood._paths import leaves_with_dotted_paths


class Block(bw.Module):
    linear: nn.Linear
    dropout: nn.Dropout
    name: str = bw.field(static=True)


class Net(bw.Module):
    blocks: list
    head: nn.Linear
    scale: jax.Array


def make_net(getkey, n_blocks=2):
    blocks = [
        Block(nn.Linear(4, 4, key=getkey()), nn.Dropout(0.1), f"block{i}")
        for i in range(n_blocks)
    ]
    return Net(blocks, nn.Linear(4, 2, key=getkey()), jnp.ones((), jnp.float32))


def test_html_tree_shows_classes_static_fields_arrays_and_counts(getkey):
    html = make_net(getkey)._repr_html_()
    assert (
        html.count("<details") == html.count("</details>") == 9
    )  # Net, list, 2 x (Block, Linear, Dropout), head
    assert html.count("<details open>") == 1  # only the root starts expanded
    assert '<span class="bw-cls">Net</span>' in html
    assert '<span class="bw-cls">Block</span>' in html
    assert 'weight: <span class="bw-arr">f32[4,4]</span>' in html
    assert 'scale: <span class="bw-arr">f32[]</span>' in html
    assert 'name = <span class="bw-static">&#x27;block0&#x27;</span>' in html
    assert "p = <span" in html and "0.1" in html  # Dropout's static configuration
    # Net: 2 * (16 + 4) + (8 + 2) + 1 = 51 parameters, 4 bytes each
    assert "51 params · 204 B" in html
    assert "20 params · 80 B" in html  # each Block


def test_html_escapes_values(getkey):
    block = Block(nn.Linear(2, 2, key=getkey()), nn.Dropout(0.0), "<script>x</script>")
    html = block._repr_html_()
    assert "<script>x" not in html and "&lt;script&gt;x&lt;/script&gt;" in html


def test_long_lists_are_folded(getkey):
    layer = nn.Linear(2, 2, key=getkey())
    html = module_html([layer] * 100)
    assert html.count('<span class="bw-cls">Linear</span>') == 100
    assert f"… {100 - FOLD_HEAD} more ({100 - FOLD_HEAD} × Linear)" in html
    short = module_html([layer] * FOLD_AT)
    assert "more (" not in short


def test_html_counts_only_floating_point_as_parameters_but_all_bytes():
    html = module_html(
        {"w": np.zeros((3, 4), np.float32), "idx": np.zeros(5, np.int64)}
    )
    assert "12 params · 88 B" in html
    assert 'idx: <span class="bw-arr">i64[5](numpy)</span>' in html


def test_html_renders_modules_returned_by_filter_jit(getkey):
    net = make_net(getkey)
    same = bw.filter_jit(lambda m: m)(net)  # built lazily from its flat form
    assert same._repr_html_() == net._repr_html_()


def test_summary_text_rows_and_totals(getkey):
    net = make_net(getkey)
    table = bw.summary({"net": net, "other": nn.Linear(3, 1, key=getkey())})
    text = str(table)
    assert repr(table) == text
    lines = text.splitlines()
    assert lines[0].split() == ["module", "type", "params", "size", "arrays"]
    assert re.match(r"^\(root\)\s+dict\[2\]\s+55\s+220 B$", lines[2])
    assert re.search(r"^    net\.blocks\.0\s+Block\s+20\s+80 B$", text, re.M)
    assert "net.head  " in text and "weight f32[2,4], bias f32[2]" in text
    assert lines[-1] == "total: 55 params, 220 B"
    assert [r.path for r in table.rows][:3] == ["(root)", "net", "net.blocks.0"]
    assert table.params == 55 and table.nbytes == 220


def test_summary_paths_are_the_dotted_paths(getkey):
    net = make_net(getkey)
    modules = {r.path for r in bw.summary(net).rows if r.nbytes} - {"(root)"}
    assert "blocks.1.linear" in modules
    leaf_names = [name for name, _ in leaves_with_dotted_paths(net)]
    for path in modules:
        assert any(name.startswith(path + ".") for name in leaf_names), path


def test_summary_html_and_max_rows(getkey):
    table = bw.summary([nn.Linear(2, 2, key=getkey()) for _ in range(30)], max_rows=5)
    html = table._repr_html_()
    assert html.count("<tr><td") == 5 + 2  # five rows, the "more" row, the total
    assert "… 26 more modules" in html
    assert "... 26 more modules (summary(model, max_rows=...) shows more)" in str(table)
    assert "total: 180 params, 720 B" in html


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_summary_rejects_bad_max_rows(bad):
    with pytest.raises(ValueError, match=r"summary: `max_rows` must be a positive int"):
        bw.summary([], max_rows=bad)


def test_treescope_renders_modules_as_constructors(getkey):
    treescope = pytest.importorskip("treescope")
    text = treescope.render_to_text(make_net(getkey))
    assert text.startswith("Net(\n  blocks=[\n    Block(")
    assert "name='block0'" in text and "Dropout(p=0.1, inference=False)" in text
    assert "head=Linear(" in text
