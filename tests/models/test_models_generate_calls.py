"""A `generate` call's host side: the model is passed to the compiled loop as it
is (switched to inference mode inside the trace), so a second call with the
same model rebuilds nothing and runs the compiled loop it already has; a model
in training mode generates as in inference mode."""

import jax
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
from _jaxprs import all_equations
from _tiny_causal_lms import gpt2, llama
from boxwood.nn import _inference


def _counting_rebuilds(monkeypatch):
    """Counts `inference_mode`'s rebuilds of a whole model (not of its parts)."""
    rebuilt = []
    original = _inference._rebuild

    def rebuild(node, value):
        if isinstance(node, bm.GPT2LMHeadModel):
            rebuilt.append(value)
        return original(node, value)

    monkeypatch.setattr(_inference, "_rebuild", rebuild)
    return rebuilt


def test_a_second_call_rebuilds_nothing_and_compiles_nothing(monkeypatch):
    model = boxwood.nn.inference_mode(gpt2(), False)  # a fresh object: a fresh trace
    rebuilt = _counting_rebuilds(monkeypatch)
    first = bm.generate(model, np.array([3, 5, 7], np.int32), 5)
    assert rebuilt == [True]  # once, while the loop is traced
    second = bm.generate(model, np.array([3, 5, 7], np.int32), 5)
    assert rebuilt == [True]  # no rebuild, and no new trace (which would rebuild)
    np.testing.assert_array_equal(first, second)


def test_a_model_in_training_mode_generates_as_in_inference_mode():
    ids = np.array([[3, 5, 7], [11, 13, 17]], np.int32)
    training = boxwood.nn.inference_mode(gpt2(), False)  # dropout 0.1 would be on
    np.testing.assert_array_equal(
        bm.generate(training, ids, 6), bm.generate(gpt2(), ids, 6)
    )


@pytest.fixture(scope="module")
def slice_modes():
    """For each `SLICE_LAYERS` mode ("never", "always"): one prompt's greedy
    tokens from GPT-2 and from Llama, and the arguments GPT-2's call passed to
    the decoding loop; and, per call, whether its loop's layers were sliced
    apart. One compiled loop per model and mode, shared by the two tests below."""
    from boxwood.models import _decode_layers, _generate, _generate_loop

    sliced, called, out = [], {}, {}
    original_apart = _generate_loop.with_layers_apart
    original = getattr(_generate._decode, "original", _generate._decode)

    def apart(model):
        result = original_apart(model)
        sliced.append(result is not model)
        return result

    def spy(*args):
        called["args"] = args
        return original(*args)

    spy.original = original
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(_generate_loop, "with_layers_apart", apart)
        monkeypatch.setattr(_generate, "_decode", spy)
        for mode in ("never", "always"):
            monkeypatch.setattr(_decode_layers, "SLICE_LAYERS", mode)
            original.clear_cache()  # traced again with this setting
            tokens = [np.asarray(bm.generate(gpt2(), np.array([3, 5, 7, 11]), 6))]
            gpt2_args = called["args"]
            tokens.append(np.asarray(bm.generate(llama(), np.array([3, 5, 7, 11]), 6)))
            out[mode] = tokens, gpt2_args
    original.clear_cache()  # later tests trace it with the default setting
    return out, sliced


def _weight_slices_in_the_loop(monkeypatch, slice_modes, mode):
    """How many slices of the stacked layers' weights the body of `generate`'s
    decoding loop takes per step, with `SLICE_LAYERS` set to `mode`."""
    import jax.numpy as jnp

    from boxwood.models import _decode_layers
    from boxwood.models._generate_loop import decode_loop

    monkeypatch.setattr(_decode_layers, "SLICE_LAYERS", mode)
    model = gpt2()
    args = slice_modes[0][mode][1]
    jaxpr = boxwood.filter_make_jaxpr(decode_loop)(*args)[0].jaxpr
    weights = {
        x.shape
        for x in jax.tree.leaves(model.blocks(model))
        if isinstance(x, jax.Array)
    }
    (loop,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    body = loop.params["body_jaxpr"].jaxpr
    return sum(
        1
        for e in all_equations(body)
        if e.primitive.name in ("slice", "dynamic_slice", "gather")
        and tuple(e.invars[0].aval.shape) in weights
        and e.invars[0].aval.dtype != jnp.int32
    )


def test_the_loop_reads_each_layer_sliced_once_before_it(monkeypatch, slice_modes):
    """Where the layers are sliced apart (on a TPU, where the copy fits; here
    asked for), the decoding loop's body reads each layer's weights as arrays
    of their own: no slice of a stacked weight is taken per step."""
    assert _weight_slices_in_the_loop(monkeypatch, slice_modes, "never") > 0
    assert _weight_slices_in_the_loop(monkeypatch, slice_modes, "always") == 0


def test_layers_sliced_apart_give_the_same_tokens(slice_modes):
    """One prompt (the only loop whose layers are sliced apart: a batch of rows,
    and beam search's beams, run the stack as it is in both modes, one program)
    gives the same greedy tokens with the layers sliced apart as without."""
    out, sliced = slice_modes
    assert sliced == [False, False, True, True]  # the second mode's loops sliced
    for never, always in zip(out["never"][0], out["always"][0], strict=True):
        np.testing.assert_array_equal(never, always)
