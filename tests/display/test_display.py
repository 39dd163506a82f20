"""`Module._repr_html_`, `boxwood.summary` and the treescope rendering."""

import re
import types

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
    layer = nn.Linear(2, 2, key=getkey())
    table = bw.summary([layer] * FOLD_AT, max_rows=5)  # 17 rows: none folded
    html = table._repr_html_()
    assert html.count("<tr><td") == 5 + 2  # five rows, the "more" row, the total
    assert "… 12 more modules" in html
    assert "... 12 more modules (summary(model, max_rows=...) shows more)" in str(table)
    assert "total: 96 params, 384 B" in html


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


# --- one name for a function, everywhere; boxwood's wrappers not shown


def test_a_function_has_one_name_in_every_display(getkey):
    model = nn.Sequential([nn.Linear(2, 3, key=getkey()), nn.Lambda(jax.nn.relu)])
    html, text = model._repr_html_(), repr(model)
    assert 'fn = <span class="bw-static">&lt;function relu&gt;</span>' in html
    assert "Lambda(fn=<function relu>)" in text
    for shown in (html, text):
        assert "custom_jvp" not in shown and "StaticFunction" not in shown
        assert " at 0x" not in shown


def test_treescope_names_functions_as_repr_does(getkey):
    treescope = pytest.importorskip("treescope")
    model = nn.MLP(2, 1, 4, 1, activation=jax.nn.gelu, key=getkey())
    text = treescope.render_to_text(model)
    assert "activation=<function gelu>," in text
    assert "StaticFunction" not in text and "jax.nn.gelu" not in text
    # no comment naming the object that carries the name, nor its address
    assert "FunctionName" not in text and " at 0x" not in text


def _shell(monkeypatch):
    """An IPython shell's display machinery, as a kernel formats a cell's value,
    with `IPython.get_ipython()` returning it."""
    ipython = pytest.importorskip("IPython")
    from IPython.core.formatters import DisplayFormatter

    shell = types.SimpleNamespace(display_formatter=DisplayFormatter())
    monkeypatch.setattr(ipython, "get_ipython", lambda: shell)
    return shell


def test_treescope_takes_over_a_cells_value_once_set_up(getkey, monkeypatch):
    treescope = pytest.importorskip("treescope")
    shell = _shell(monkeypatch)
    model = nn.MLP(2, 1, 4, 1, key=getkey())
    html = shell.display_formatter.format(model)[0]["text/html"]
    assert 'class="bw-tree"' in html  # boxwood's tree by default
    treescope.register_as_default()  # what `basic_interactive_setup()` does first
    html = shell.display_formatter.format(model)[0]["text/html"]
    assert "treescope-container" in html and 'class="bw-tree"' not in html
    # asked directly, a module still gives boxwood's tree; treescope's own
    # rendering attaches it as the "rich HTML" view, and names functions
    assert 'class="bw-tree"' in model._repr_html_()
    html = treescope.render_to_html(model, compressed=False)
    assert "bw-tree" in html and "&lt;function relu&gt;" in html
    assert "FunctionName" not in html


def test_display_hooks_are_plain_methods():
    class Shown(bw.Module):
        x: jax.Array

        def _repr_html_(self):
            return "<b>shown</b>"

    shown = Shown(jnp.ones(2))
    assert isinstance(shown._repr_html_, types.MethodType)  # treescope takes it
    assert isinstance(nn.Identity()._repr_html_, types.MethodType)
    assert isinstance(nn.Identity().__treescope_repr__, types.MethodType)


def test_summary_folds_long_sequences_as_the_tree_does(getkey):
    layer = nn.Linear(2, 2, key=getkey())  # 6 parameters
    model = nn.Sequential([layer] * 100)
    table = bw.summary(model)
    paths = [r.path for r in table.rows]
    head = [f"layers.{i}" for i in range(FOLD_HEAD)]
    assert paths == ["(root)", *head, f"layers.{FOLD_HEAD} … layers.99"]
    fold = table.rows[-1]
    assert (fold.type, fold.folded, fold.depth) == ("92 × Linear", 92, 1)
    assert (fold.params, table.params) == (92 * 6, 100 * 6)
    assert re.search(
        r"^  layers\.8 … layers\.99\s+92 × Linear\s+552\s", str(table), re.M
    )
    assert "… 92 more (92 × Linear)" in module_html(model)
    # a folded entry's own submodules get no rows either
    blocks = nn.Sequential([nn.Sequential([layer, nn.Lambda(jnp.tanh)])] * 20)
    rows = bw.summary(blocks).rows
    assert len(rows) == 1 + FOLD_HEAD * 3 + 1  # Sequential, Linear, Lambda
    assert rows[-1].type == "12 × Sequential" and rows[-1].params == 12 * 6


def test_equinox_modules_show_as_modules(getkey):
    eqx = pytest.importorskip("equinox")
    if eqx.Module is bw.Module:  # replaced by boxwood in this process
        pytest.skip("equinox is boxwood here")
    linear = eqx.nn.Linear(2, 3, key=getkey())
    assert [(r.path, r.params) for r in bw.summary(linear).rows] == [("(root)", 9)]
    html = module_html(linear)
    assert 'weight: <span class="bw-arr">f32[3,2]</span>' in html
    assert 'in_features = <span class="bw-static">2</span>' in html


def test_wrapped_functions_are_static_entries_not_nodes(getkey):
    html = nn.MLP(2, 1, 4, 1, key=getkey())._repr_html_()
    assert '<span class="bw-cls">StaticFunction</span>' not in html
    assert 'activation = <span class="bw-static">&lt;function relu&gt;</span>' in html
    assert "<details" in html and html.count("0 params") == 0


def _f(x):
    return x


class _Holder:
    def method(self):
        return None


@pytest.mark.parametrize(
    "value, shown",
    [
        (jax.nn.relu, "<function relu>"),  # a custom_jvp
        (jax.jit(_f), "<function _f>"),
        (bw.filter_jit(_f), "<function _f>"),
        (jnp.tanh, "<function tanh>"),
        (len, "<function len>"),
        (np.add, "<function add>"),
        (_Holder().method, "<function _Holder.method>"),
        (__import__("functools").partial(_f, 1), "partial(<function _f>, 1)"),
        (nn.Lambda(jax.nn.relu).fn, "<function relu>"),  # nn.StaticFunction
        (3, None),
        ("relu", None),
    ],
)
def test_function_names(value, shown):
    from boxwood._pretty import function_name

    assert function_name(value) == shown


# --- the first lines of the notebook display


class Mixed(bw.Module):
    w: jax.Array
    half: jax.Array
    count: jax.Array
    act: object
    size: int = bw.field(static=True, default=3)


def _on_cpu(arrays):
    """`arrays` in host memory, computed: the display checks NaN/Inf by itself only
    there (on an accelerator reading waits for the device), whatever the backend."""
    return jax.block_until_ready(jax.device_put(arrays, jax.devices("cpu")[0]))


def _mixed(w=None):
    w = jnp.ones((2, 4), jnp.float32) if w is None else w
    arrays = _on_cpu((w, jnp.ones(8, jnp.bfloat16), jnp.zeros(3, jnp.int32)))
    return Mixed(*arrays, nn.Lambda(jnp.tanh).fn)


def _heads(html):
    return re.findall(r'<div class="bw-head">(.*?)</div>', html)


def test_the_display_starts_with_totals_dtypes_static_fields_and_finiteness():
    heads = _heads(_mixed()._repr_html_())
    assert heads == [
        "16 params, 60 B (f32 32 B, bf16 16 B, i32 12 B)",
        "static fields: Mixed: act, size",
        "no NaN or Inf",
    ]


def test_the_display_names_the_arrays_holding_nan_or_inf():
    w = jnp.array([[1.0, jnp.nan, jnp.inf, 2.0], [jnp.nan, 0.0, 0.0, 0.0]])
    model = _mixed(w)
    assert _heads(model._repr_html_())[-1] == "NaN/Inf in 1 array: w (2 NaN, 1 Inf)"
    assert _heads(module_html(model, check_finite=False))[-1].startswith(
        "NaN/Inf not checked"
    )
    text = str(bw.summary(model, check_finite=True))
    assert text.splitlines()[-1] == "NaN/Inf in 1 array: w (2 NaN, 1 Inf)"
    assert "NaN" not in str(bw.summary(model))  # only on request
    assert "NaN/Inf in 1 array" in bw.summary(model, check_finite=True)._repr_html_()


def test_a_large_model_is_not_read_for_the_display_unless_asked(monkeypatch):
    from boxwood import _finite

    monkeypatch.setattr(_finite, "CHEAP_ELEMENTS", 8)  # the model has 2*4+8+3
    reads = []
    model = _mixed(jnp.full((2, 4), jnp.nan))
    real = _finite.host_values
    monkeypatch.setattr(_finite, "host_values", lambda x: reads.append(x) or real(x))
    heads = _heads(model._repr_html_())
    assert heads[-1] == (
        "NaN/Inf not checked (reading a large model or one on an accelerator waits "
        "for the device; boxwood.summary(model, check_finite=True) checks)"
    )
    assert reads == []
    assert _heads(module_html(model, check_finite=True))[-1].startswith(
        "NaN/Inf in 1 array: w (8 NaN"
    )
    assert {id(x) for x in reads} == {id(model.w), id(model.half)}  # on request


def test_a_model_of_many_arrays_is_not_read_for_the_display(monkeypatch):
    from boxwood import _finite

    monkeypatch.setattr(_finite, "CHEAP_ARRAYS", 1)  # the model has two float arrays
    assert _heads(_mixed()._repr_html_())[-1].startswith("NaN/Inf not checked")


def test_many_arrays_with_nan_are_named_five_at_a_time():
    tree = _on_cpu([jnp.full(2, jnp.nan) for _ in range(7)])
    head = _heads(module_html(tree))[-1]
    assert head.startswith("NaN/Inf in 7 arrays: 0 (2 NaN, 0 Inf), 1 (2 NaN")
    assert head.endswith("4 (2 NaN, 0 Inf) and 2 more")


def test_summary_rejects_a_bad_check_finite():
    with pytest.raises(TypeError, match=r"summary: `check_finite` must be True or"):
        bw.summary([], check_finite="yes")


def test_bfloat16_arrays_are_parameters():
    table = bw.summary(_mixed())
    assert table.params == 16 and table.nbytes == 60
