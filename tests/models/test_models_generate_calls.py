"""A `generate` call's host side: the model is passed to the compiled loop as it
is (switched to inference mode inside the trace), so a second call with the
same model rebuilds nothing and runs the compiled loop it already has; a model
in training mode generates as in inference mode."""

import numpy as np

import boxwood
import boxwood.models as bm
from _tiny_causal_lms import gpt2
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
