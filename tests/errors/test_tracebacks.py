"""boxwood's frames are left out of the source locations JAX records (as JAX's
own are): a lowered program's metadata names the user's lines only. And an error
raised through `filter_jit` or a filtered transformation shows no more of
boxwood's frames than `jax.jit` shows of JAX's: removed in plain Python (and so
under pytest), marked `__tracebackhide__` under IPython."""

import contextlib
import io
import os
import traceback

import jax
import jax.numpy as jnp
import pytest

import boxwood as bw

BOXWOOD = os.path.dirname(os.path.abspath(bw.__file__))


def _user_function(x):
    return jnp.sin(x) * 2.0


def test_lowered_locations_name_the_users_lines_not_boxwoods():
    layer = bw.nn.Linear(3, 3, key=jax.random.key(0))

    @bw.filter_jit
    def f(model, x):
        return _user_function(model(x))

    text = f.lower(layer, jnp.ones(3)).as_text(debug_info=True)
    assert __file__ in text  # the user's file is named
    assert BOXWOOD not in text  # none of boxwood's own


def test_a_checkpointed_loop_records_only_the_users_frames():
    from boxwood.internal import while_loop

    def loss(x):
        out = while_loop(
            lambda c: c[0] < 5, lambda c: (c[0] + 1, _user_function(c[1]) * x),
            (0, jnp.ones(2)), kind="checkpointed", max_steps=8,
        )  # fmt: skip
        return out[1].sum()

    text = jax.jit(jax.grad(loss)).lower(0.5).as_text(debug_info=True)
    assert __file__ in text
    assert BOXWOOD not in text


# ------------------------------------------------------------------ tracebacks
# Three errors, each as a user meets it: a shape error several calls deep (the
# function reads its helpers from this module's globals: `filter_jit`'s capture
# layer is in front), an `if` on a traced value, a failed check.


def _deepest(x, w):
    return x @ w


def _middle(x, w):
    return _deepest(x, w) + 1


def _shape_error(x, w):
    return _middle(x, w) * 2


def _traced_if(x, w):
    if x.sum() > 0:
        return x
    return w


def _failed_check(x, w):
    x = bw.error_if(x, x.sum() > 0, "x must be negative")  # the check's line
    return x * 2


_CASES = {
    "shape": (_shape_error, (jnp.ones((3, 4)), jnp.ones((5, 2)))),
    "if": (_traced_if, (jnp.ones(3), jnp.ones(3))),
    "check": (_failed_check, (jnp.ones(3), jnp.ones(3))),
}


@contextlib.contextmanager
def _filtering(mode):
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", mode)
    try:
        yield
    finally:
        jax.config.update("jax_traceback_filtering", before)


@pytest.fixture(autouse=True)
def _jax_filtering_as_by_default():
    """The tests below read tracebacks as JAX's default setting shapes them
    (whatever `JAX_TRACEBACK_FILTERING` the suite runs with)."""
    with _filtering("auto"):
        yield


def _raised(fun, *args):
    """The error `fun(*args)` raises, its results waited for."""
    with pytest.raises(Exception) as info:
        jax.block_until_ready(fun(*args))
    return info.value


def _files(error):
    return [frame.filename for frame in traceback.extract_tb(error.__traceback__)]


def _own(files):
    return [f for f in files if f.startswith(BOXWOOD)]


@pytest.mark.parametrize("case", sorted(_CASES))
def test_an_error_shows_no_frame_of_boxwood_and_no_more_than_jax_jit(case):
    fun, args = _CASES[case]
    ours = _raised(bw.filter_jit(fun), *args)
    theirs = _raised(jax.jit(fun), *args)
    assert _own(_files(ours)) == []
    assert len(_files(ours)) <= len(_files(theirs))
    # what Python prints (the frames of this test included)
    printed = "".join(traceback.format_exception(ours))
    assert BOXWOOD not in printed
    assert printed.count("\n") <= "".join(traceback.format_exception(theirs)).count(
        "\n"
    )
    if case != "check":
        assert fun.__name__ in printed  # the user's own frames are kept


@pytest.mark.parametrize("case", ["if", "shape"])
def test_no_more_frames_than_equinox(case):
    eqx = pytest.importorskip("equinox")
    fun, args = _CASES[case]
    ours = _files(_raised(bw.filter_jit(fun), *args))
    assert len(ours) <= len(_files(_raised(eqx.filter_jit(fun), *args)))


def test_the_shape_error_keeps_every_user_frame_down_to_the_matmul():
    fun, args = _CASES["shape"]
    names = [
        f.name
        for f in traceback.extract_tb(_raised(bw.filter_jit(fun), *args).__traceback__)
    ]
    assert names[1:4] == ["_shape_error", "_middle", "_deepest"]


def test_warm_calls_and_compiled_calls_hide_boxwoods_frames_too():
    @bw.filter_jit
    def f(x, w):
        return _failed_check(x, w)

    x = jnp.ones(3)
    f(-x, x)  # compiled, now on the warm path
    assert _own(_files(_raised(f, x, x))) == []
    compiled = f.lower(-x, x).compile()
    assert _own(_files(_raised(compiled, x, x))) == []
    fun, args = _CASES["if"]
    assert _own(_files(_raised(bw.filter_jit(fun).lower, *args))) == []


def test_a_method_of_a_module_under_filter_jit_and_eagerly():
    class Inner(bw.Module):
        w: jax.Array

        def __call__(self, x):
            return _deepest(x, self.w)

    class Outer(bw.Module):
        inner: Inner

        def __call__(self, x):
            return self.inner(x) + 1

    model, x = Outer(Inner(jnp.ones((5, 2)))), jnp.ones((3, 4))
    for call in (model, bw.filter_jit(model)):
        files = _files(_raised(call, x))
        assert _own(files) == []
        assert files.count(__file__) == 4  # this test, Outer, Inner, _deepest


def test_the_users_own_error_keeps_its_text():
    # boxwood adds no note: `pytest.raises(match=...)` reads the error's own text
    class Model(bw.Module):
        def __call__(self, x):
            raise ValueError("mine")

    with pytest.raises(ValueError, match="^mine$") as info:
        Model()(1.0)
    assert _own(_files(info.value)) == []


def _loss(x, w):
    return _deepest(x, w).sum()


@bw.filter_custom_jvp
def _custom(x, w):
    return _loss(x, w)


@_custom.def_jvp
def _custom_jvp(primals, tangents):
    return _custom(*primals), 0.0


_TRANSFORMED = {
    "filter_custom_jvp": lambda x, w: _custom(x, w),
    "filter_grad": lambda x, w: bw.filter_grad(_loss)(x, w),
    "filter_value_and_grad": lambda x, w: bw.filter_value_and_grad(_loss)(x, w),
    "filter_vmap": lambda x, w: bw.filter_vmap(_loss, in_axes=(None, 0))(x, w[None]),
    "filter_jvp": lambda x, w: bw.filter_jvp(_loss, (x, w), (x, w)),
    "filter_eval_shape": lambda x, w: bw.filter_eval_shape(_loss, x, w),
    "filter_checkpoint": lambda x, w: bw.filter_checkpoint(_loss)(x, w),
    "filter_scan": lambda x, w: bw.filter_scan(
        lambda c, _: (c, _loss(c, w)), x, None, length=2
    ),
    "filter_jit(filter_grad)": lambda x, w: bw.filter_jit(bw.filter_grad(_loss))(x, w),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMED))
def test_the_filtered_transformations_hide_boxwoods_frames(name):
    files = _files(_raised(_TRANSFORMED[name], jnp.ones((3, 4)), jnp.ones((5, 2))))
    assert _own(files) == []
    assert files.count(__file__) >= 3  # the lambda, `_loss`, `_deepest`


def test_jax_traceback_filtering_off_shows_every_frame():
    fun, args = _CASES["shape"]
    with _filtering("off"):
        error = _raised(bw.filter_jit(fun), *args)
    assert _own(_files(error)) != []


def test_tracebackhide_marks_the_frames_for_pytest():
    fun, args = _CASES["shape"]
    with _filtering("tracebackhide"), pytest.raises(TypeError) as info:
        bw.filter_jit(fun)(*args)
    entries = info.traceback
    own = [e for e in entries if str(e.path).startswith(BOXWOOD)]
    assert own  # kept (a debugger can step into them), and hidden:
    assert all(e.ishidden(info) for e in own)
    assert not any(e.ishidden(info) for e in entries if e.name == "_deepest")
    shown = str(info.getrepr(style="short"))
    assert BOXWOOD not in shown and "_deepest" in shown


_CELL = """
class Model(bw.Module):
    def __call__(self, x):
        raise ValueError("from the user's method")

Model()(1.0)
"""


def test_ipython_hides_boxwoods_frames():
    # IPython reads the source of every frame, hidden ones too (JAX's are slow to
    # read): a module's method called eagerly, and a failed check, whose frames
    # are the cell's and boxwood's alone
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config, colors="nocolor")
    shown = []
    try:
        shell.user_ns.update(bw=bw, cases=_CASES)
        for cell in (_CELL, "f, a = cases['check']\nbw.filter_jit(f)(*a)\n"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                shell.run_cell(cell)
            shown.append(out.getvalue())
    finally:
        InteractiveShell.clear_instance()
    method, check = shown
    assert "from the user's method" in method and "raise ValueError" in method
    assert "skipping hidden 1 frame" in method  # marked: `%debug` can reach it
    assert "x must be negative" in check and "skipping hidden" not in check
    assert BOXWOOD not in method + check


# ------------------------------------------------------------------ error_if


def test_a_failed_check_names_its_file_line_and_source():
    fun, args = _CASES["check"]
    with pytest.raises(bw.BoxwoodRuntimeError) as info:
        bw.filter_jit(fun)(*args)
    text = str(info.value)
    line = _failed_check.__code__.co_firstlineno + 1
    assert text.startswith("x must be negative\n")
    assert f'File "{__file__}", line {line}, in _failed_check' in text
    assert 'bw.error_if(x, x.sum() > 0, "x must be negative")' in text


def _nested_check(x):
    return bw.branched_error_if(x, x.sum() > 0, 1, ["zero", "one"])


def test_a_failed_branched_check_names_every_user_frame_inside_the_jit():
    @bw.filter_jit
    def f(x):
        return _nested_check(x) * 2  # the outer frame

    with pytest.raises(bw.BoxwoodRuntimeError, match="^one\n") as info:
        f(jnp.ones(2))
    text = str(info.value)
    assert text.index("the outer frame") < text.index("bw.branched_error_if(")
    assert "test_a_failed_branched_check" not in text  # outside the compiled code


def test_a_check_known_when_traced_raises_at_its_own_line():
    with pytest.raises(bw.BoxwoodRuntimeError, match="^negative") as info:
        bw.error_if(jnp.array(-1.0), True, "negative")  # eager: Python's traceback
    assert str(info.value) == "negative"
    assert _own(_files(info.value)) == []


# ------------------------------------------------------------ jax.debug.print


def _print_and_return(x):
    y = x * 2
    jax.debug.print("sum {}", y.sum())
    return y


def test_debug_print_of_the_sum_of_the_one_output_compiles(capfd):
    # XLA's CPU backend (jaxlib 0.10) fails to compile this under plain `jax.jit`
    # ("RET_CHECK failure ... is live and cannot be removed", from 64x64 up):
    # the one output, reduced for a side effect. A second output avoids it.
    x = jnp.ones((64, 64))
    out = bw.filter_jit(_print_and_return)(x)
    jax.effects_barrier()
    assert out.shape == (64, 64) and float(out[0, 0]) == 2.0
    assert "sum 8192.0" in capfd.readouterr().out


def test_only_programs_with_side_effects_get_the_extra_output():
    x = jnp.ones(3)
    plain = bw.filter_jit(lambda x: x * 2).lower(x).as_text()
    printing = bw.filter_jit(_print_and_return).lower(x).as_text()
    assert plain.count("jax.result_info") == 1
    assert printing.count("jax.result_info") == 2
