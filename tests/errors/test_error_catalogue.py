"""The error catalogue (docs/errors.md) has an entry for every exception boxwood's
source builds, and errors name the user's own tree paths."""

import os

import jax
import jax.numpy as jnp
import jax.random as jr
import pytest
from jax.sharding import PartitionSpec as P

import boxwood as bw
from _error_sites import (
    CATALOGUE,
    Site,
    catalogue_entries,
    covers,
    dropped_backticks,
    scan_source,
    scan_tree,
    stale_rows,
    uncovered,
)
from boxwood import nn

# Exceptions that bad input cannot reach with a message of boxwood's own:
# (file, enclosing function, class) -> why.
ALLOWED = {
    ("src/boxwood/_display/_walk.py", "human_bytes", "AssertionError"): (
        "unreachable: the loop returns for every size"
    ),
    ("src/boxwood/_sharding/_plan.py", "_bytes", "AssertionError"): (
        "unreachable: the loop returns for every size"
    ),
    ("src/boxwood/_checkpoint/_orbax.py", "_OrbaxTensor.read", "AssertionError"): (
        "internal: orbax tensors are restored together, never read one by one"
    ),
    ("src/boxwood/_init/_draw.py", "_unsupported", "NotImplementedError"): (
        "internal: the private chunk keys reach only jax.random draws, which never "
        "split or seed them"
    ),
    ("src/boxwood/_init/_const.py", "scalar", "TypeError"): (
        "internal: the layers call it with the literals 0 and True only"
    ),
    ("src/boxwood/_module/_flat_build.py", "_Emitter.emit", "RecursionError"): (
        "internal control flow: caught by the caller, which falls back"
    ),
    ("src/boxwood/_jit/_aot.py", "Lowered.__getattr__", "AttributeError"): (
        "attribute protocol: a name neither object nor JAX's stage has"
    ),
    ("src/boxwood/_jit/_aot.py", "Compiled.__getattr__", "AttributeError"): (
        "attribute protocol: a name neither object nor JAX's stage has"
    ),
    ("src/boxwood/_errors.py", "as_boxwood_error", "BoxwoodRuntimeError"): (
        "carries the message the user gave error_if (catalogued as <your message>)"
    ),
    ("src/boxwood/_errors.py", "raise_as_boxwood_error", "BoxwoodRuntimeError"): (
        "carries the message the user gave error_if, plus a debugging hint"
    ),
    ("src/boxwood/_errors.py", "raise_failure", "BoxwoodRuntimeError"): (
        "carries the message the user gave error_if, plus a debugging hint"
    ),
    ("src/boxwood/_errors.py", "_raise_branch.raises", "BoxwoodRuntimeError"): (
        "carries the message the user gave branched_error_if"
    ),
    ("src/boxwood/_errors.py", "_resolve_now", "BoxwoodRuntimeError"): (
        "carries the message the user gave error_if"
    ),
    ("src/boxwood/internal/_nondiff.py", "_RefuseTangents.__call__", "RuntimeError"): (
        "carries nondifferentiable's message (its default text is catalogued)"
    ),
    ("src/boxwood/internal/_nondiff.py", "_refuse_cotangent", "RuntimeError"): (
        "carries nondifferentiable_backward's message (default text catalogued)"
    ),
    ("src/boxwood/internal/_nontraceable.py", "_unbatched", "ValueError"): (
        "carries the message the caller gave nonbatchable"
    ),
    ("src/boxwood/_module/_module.py", "_Method.__getattr__", "AttributeError"): (
        "attribute protocol: a name the method's function does not have"
    ),
    ("src/boxwood/internal/_buffers.py", "_Buffer.__getattr__", "AttributeError"): (
        "attribute protocol: a name the buffer's array does not have"
    ),
    ("src/boxwood/models/_pretrained.py", "Pretrained._load_into", "CheckpointError"): (
        "raises _new_parameters.resized_message's text, which is catalogued"
    ),
    ("src/boxwood/demo/__init__.py", "main", "SystemExit"): (
        "the command line's exit status 2 after printing a catalogued DemoError"
    ),
    ("src/boxwood/demo/_run.py", "load_data", "DemoError"): (
        "prefixes --data to the data loader's error, which is catalogued"
    ),
}


@pytest.fixture(scope="module")
def entries():
    return catalogue_entries(CATALOGUE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sites():
    return scan_tree()


def test_the_scan_finds_the_sites_it_should(sites):
    # a sanity check on the scanner itself: a few well-known sites and keys
    keys = {(s.file, s.exc, s.key) for s in sites}
    assert (
        "src/boxwood/_module/_module.py",
        "FrozenInstanceError",
        "Cannot assign … after __init__ has",
    ) in keys
    assert len(sites) > 200


def test_every_exception_in_src_has_a_catalogue_entry(sites, entries):
    missing = uncovered(sites, entries, set(ALLOWED))
    assert not missing, (
        "These exceptions have no entry in docs/errors.md (a table row naming the "
        "class and containing the key, with '…' for the varying parts):\n"
        + "\n".join(map(str, missing))
    )


def test_the_allow_list_names_real_sites(sites):
    present = {(s.file, s.function, s.exc) for s in sites}
    assert set(ALLOWED) <= present


# Rows that match no exception site on purpose (warnings are not scanned), by their
# start after normalising.
ROWS_WITHOUT_SITE = (
    "| warning ",
    "| boxwood.BoxwoodRuntimeError: <your message>",  # the user's own message
    "| RuntimeError: Unexpected tangent.",  # built by internal._nondiff._message
    "| boxwood-demo: error: ... (exit status 2)",  # the command line's summary row
    # built by models._new_parameters.resized_message
    "| CheckpointError: ….from_pretrained: the checkpoint in … holds …'s head",
    # built by models._id_ranges.check_labels for each loss
    "| ValueError: …: labels must hold … from 0 to …",
)


def test_every_catalogue_row_matches_a_site(sites, entries):
    # a row whose message no longer exists in src/ is stale: reword or remove it
    stale = stale_rows(entries, sites, ROWS_WITHOUT_SITE)
    assert not stale, "\n".join(stale)


def test_a_row_for_a_message_that_changed_is_stale(sites):
    old = "| `ValueError: This State is stale; use the new one` | x | y |"
    new = "| `ValueError: This State is out of date: state.set(...)` | x | y |"
    rows = catalogue_entries(old + "\n" + new)
    assert stale_rows(rows, sites, ROWS_WITHOUT_SITE) == rows[:1]


def test_catalogue_rows_keep_the_backticks_of_messages(sites):
    raw = CATALOGUE.read_text(encoding="utf-8").splitlines()
    rows = [line for line in raw if line.startswith("| ") and "---" not in line]
    assert dropped_backticks(rows, sites) == []


def test_a_row_dropping_backticks_is_reported():
    source = 'def f(n):\n    raise ValueError(f"summary: `max_rows` must be positive, got {n}")\n'
    sites = scan_source(source, "src/boxwood/_x.py")
    assert sites[0].names == ("max_rows",)
    plain = "| `ValueError: summary: max_rows must be positive, got 0` | x | y |"
    assert dropped_backticks([plain], sites) == [
        "`ValueError: summary: max_rows must be positive, got 0`: max_rows"
    ]
    kept = "| ``ValueError: summary: `max_rows` must be positive, got 0`` | x | y |"
    assert dropped_backticks([kept], sites) == []


def test_catalogue_rows_have_three_filled_cells(entries):
    for row in entries:
        cells = row.strip("| ").split(" | ")
        assert len(cells) == 3 and all(cells), row


# --- the scanner on synthetic sources: a new raise without an entry must fail

NEW_RAISE = """
def frobnicate(widget):
    if widget is None:
        raise ValueError(f"frobnicate: the widget {widget!r} needs a sprocket, got none")
"""


def test_a_new_raise_without_an_entry_is_reported(entries):
    sites = scan_source(NEW_RAISE, "src/boxwood/_new.py")
    assert [(s.exc, s.key, s.function) for s in sites] == [
        ("ValueError", "frobnicate: the widget … needs a sprocket", "frobnicate")
    ]
    assert uncovered(sites, entries, set()) == sites
    row = "| `ValueError: frobnicate: the widget None needs a sprocket` | x | y |"
    assert uncovered(sites, entries + catalogue_entries(row), set()) == []


def test_an_entry_must_name_the_exception_class():
    (site,) = scan_source(NEW_RAISE, "src/boxwood/_new.py")
    wrong = catalogue_entries(
        "| `TypeError: frobnicate: the widget 1 needs a sprocket` | x | y |"
    )
    assert uncovered([site], wrong, set()) == [site]


def test_an_entry_must_contain_the_literal_parts_in_order():
    (site,) = scan_source(NEW_RAISE, "src/boxwood/_new.py")
    assert not covers(
        catalogue_entries("| `ValueError: frobnicate` | x | y |")[0], site
    )
    swapped = "| `ValueError: needs a sprocket frobnicate: the widget` | x | y |"
    assert not covers(catalogue_entries(swapped)[0], site)


def test_messages_from_constants_variables_format_and_helpers():
    source = """
MSG = "Cannot frob `{name}`: it is {what}."

def _bad(path, what):
    return CheckpointError(f"{path}: {what}")

def a(name):
    raise TypeError(MSG.format(name=name, what="x"))

def b(n):
    message = "the sprocket count " + str(n) + " is odd"
    raise ValueError(message)

def c(path):
    raise _leaf_error(path, f"could not be frobbed: {path}")

def d():
    try:
        a("x")
    except TypeError as e:
        raise            # re-raises are not new sites
    except ValueError as e:
        raise e

def e():
    raise AssertionError
"""
    sites = scan_source(source, "src/boxwood/_x.py")
    got = [(s.function, s.exc, s.key) for s in sites]
    assert got == [
        ("_bad", "CheckpointError", None),
        ("a", "TypeError", "Cannot frob … it is"),
        ("b", "ValueError", "the sprocket count … is odd"),
        ("c", "CheckpointError", "could not be frobbed"),
        ("e", "AssertionError", None),
    ]
    # a site without a recognisable message is never covered by an entry ...
    anything = catalogue_entries("| `AssertionError CheckpointError` | x | y |")
    assert Site("src/boxwood/_x.py", 26, "e", "AssertionError", None) in uncovered(
        sites, anything, set()
    )
    # ... only by the allow-list
    left = uncovered(
        sites,
        anything,
        {
            ("src/boxwood/_x.py", "e", "AssertionError"),
            ("src/boxwood/_x.py", "_bad", "CheckpointError"),
        },
    )
    assert [s.function for s in left] == ["a", "b", "c"]


# --- errors name the user's own tree path


class Net(bw.Module):
    layers: list

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class NotHashable:
    def __eq__(self, other):  # defining __eq__ alone makes instances unhashable
        return self is other


def _net(out=2):
    key = jr.key(0)
    return Net([nn.Linear(3, 4, key=key), nn.Linear(4, out, key=key)])


def test_filter_jit_names_the_unhashable_argument_by_its_path():
    f = bw.filter_jit(lambda model, x: model(x))
    model = Net([nn.Linear(3, 3, key=jr.key(0)), NotHashable()])
    with pytest.raises(
        TypeError, match=r"`args\[0\]\.layers\[1\]` \(of type NotHashable\)"
    ):
        f(model, jnp.ones(3))


def test_checkpoint_mismatch_names_the_leaf(tmp_path):
    path = os.fspath(tmp_path / "model.safetensors")
    bw.save(path, _net(2))
    with pytest.raises(
        bw.CheckpointError,
        match=r"layers\.1\.weight: file has f32\[2,4\], model expects f32\[3,4\]",
    ):
        bw.load(path, _net(3))


def test_sharding_rule_names_the_leaf():
    mesh = bw.make_mesh((1,), ("model",))
    rules = [(r"layers\.1\.weight", P(None, None, "model")), (".*", P())]
    with pytest.raises(ValueError, match=r"does not fit leaf `layers\.1\.weight`"):
        bw.shard(_net(), mesh, rules)


def test_filter_scan_names_the_scalar_in_xs():
    with pytest.raises(ValueError, match=r"`xs\['steps'\]\['lr'\]` is a scalar array"):
        bw.filter_scan(lambda c, x: (c, x), 0.0, {"steps": {"lr": jnp.array(1.0)}})


def test_shardings_check_names_the_leaf():
    with pytest.raises(TypeError, match=r"`in_shardings\[0\]\.layers\[0\]` is 3"):
        bw.filter_jit(lambda m: m, in_shardings=(Net([3, None]),))


def test_tree_check_names_both_places():
    layer = nn.Linear(3, 3, key=jr.key(0))
    with pytest.raises(
        ValueError, match=r"`Linear` at `\.layers\[1\]` also appears at `\.layers\[0\]`"
    ):
        bw.tree_check(Net([layer, layer]))


def test_nn_init_names_the_rejected_leaf():
    def only_matrices(key, shape, dtype):
        if len(shape) != 2:
            raise ValueError("needs a matrix")
        return jnp.zeros(shape, dtype)

    with pytest.raises(ValueError, match=r"rejected `layers\.1\.bias` of shape \(2,\)"):
        nn.init(_net(), lambda m: m.layers[1].bias, only_matrices, key=jr.key(0))


@pytest.mark.parametrize("has_aux", [False, True])
def test_grad_of_a_non_scalar_output(has_aux):
    def f(model, x):
        y = model(x)
        return (y, None) if has_aux else y

    with pytest.raises(
        TypeError,
        match=r"`filter_grad` needs the function to return a scalar \(such as a "
        r"loss\), but it returned an array of shape \(2,\)\. Reduce it first",
    ):
        bw.filter_grad(f, has_aux=has_aux)(_net(), jnp.ones(3))
    with pytest.raises(
        TypeError, match=r"`filter_value_and_grad` needs .* shape \(2,\)"
    ):
        bw.filter_value_and_grad(f, has_aux=has_aux)(_net(), jnp.ones(3))


def test_grad_of_a_scalar_output_is_unaffected():
    grads = bw.filter_grad(lambda m, x: m(x).sum())(_net(), jnp.ones(3))
    assert grads.layers[1].weight.shape == (2, 4)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(_net())
