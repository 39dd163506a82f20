"""`generate`'s compiled program holds no host callback (its ids are known to be
in range, so the models' traced id check is left out), and so JAX's persistent
compilation cache keeps it across processes; a user's own `jax.jit(model)` still
holds the check."""

import json
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.models as bm
import boxwood.models._generate as generate_module
from _child_flags import child_env
from _hf_models import shared_tiny, token_ids
from boxwood.models._id_ranges import check_ids_below, ids_known_in_range

FAMILIES = ["gpt2", "llama"]


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request):
    return shared_tiny(request.param)[0]


def _has_callback(lowered_text):
    """Whether a lowered program calls the host: a callback's custom call (CPU,
    GPU), or the host transfers a TPU lowers it to."""
    text = lowered_text.lower()
    return any(mark in text for mark in ("callback", "host_transfer", ".send"))


_PROGRAM = generate_module._decode  # the compiled loop, before any spy


class _Called(Exception):
    """Raised by the spy in place of compiling and running the loop."""


def _generate_program_text(monkeypatch, model, prompts, **kwargs):
    """The lowered text of the program that `generate(model, prompts, 3)` runs
    (its arguments caught on the way in; the loop itself is not run)."""
    calls = []

    def spy(*args):
        calls.append(args)
        raise _Called

    monkeypatch.setattr(generate_module, "_decode", spy)
    with pytest.raises(_Called):
        bm.generate(model, prompts, 3, **kwargs)
    (args,) = calls
    return _PROGRAM.lower(*args).as_text()


def test_generate_program_holds_no_callback(saved, monkeypatch):
    model = bm.from_pretrained(saved)
    one = jnp.asarray(token_ids(0, (5,)))
    assert not _has_callback(_generate_program_text(monkeypatch, model, one))
    ragged = [token_ids(1, (4,)), token_ids(2, (9,))]  # vmap with left padding
    assert not _has_callback(_generate_program_text(monkeypatch, model, ragged))
    # the user's own compiled forward keeps the traced check, and it raises
    assert _has_callback(jax.jit(model).lower(one).as_text())
    forward = boxwood.filter_jit(model)
    with pytest.raises(boxwood.BoxwoodRuntimeError, match="`input_ids` must hold"):
        forward(one.at[2].set(model.config.vocab_size)).block_until_ready()
    # a streaming callback is a host callback of its own
    text = _generate_program_text(monkeypatch, model, one, callback=lambda t: None)
    assert _has_callback(text)


def test_known_in_range_is_scoped_and_per_thread():
    ids = jnp.arange(4)

    def check(x):
        return check_ids_below("M", "input_ids", x, 3, "vocab_size")

    def traced():
        # a new function each time: JAX reuses a trace of the same function
        fresh = lambda x: check(x)  # noqa: E731
        return _has_callback(jax.jit(fresh).lower(ids).as_text())

    inside, release = threading.Event(), threading.Event()
    seen = []

    def other_thread():
        with ids_known_in_range():
            seen.append(traced())
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert inside.wait(30)
        assert traced()  # this thread still checks while the other skips
    finally:
        release.set()
        thread.join()
    assert seen == [False]
    with ids_known_in_range():
        with pytest.raises(ValueError, match="got 3 at position 3"):
            check(ids)  # concrete ids are still checked
        with pytest.raises(TypeError, match="must be an integer array"):
            jax.jit(check)(ids.astype(jnp.float32))
    assert traced()  # the setting ends with the block


_CHILD = """
import json, logging, sys
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
for name in ("jax._src.compiler", "jax._src.compilation_cache"):
    logger = logging.getLogger(name)
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
import jax.numpy as jnp
import boxwood.models as bm
results = []
for path in sys.argv[2:]:  # one checkpoint after another, each with its own log
    messages.clear()
    model = bm.from_pretrained(path)
    out = bm.generate(model, jnp.asarray([5, 6, 7, 8, 9]), 3)
    log = [m for m in messages if "decode_loop" in m]
    results.append({"tokens": out.tolist(), "log": log})
print(json.dumps(results))
"""


def _run_child(cache, paths):
    env = child_env(BOXWOOD_ON_ERROR=None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(cache), *map(str, paths)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_process_reads_generate_from_the_cache(tmp_path):
    """Every family's loop, written by one process, is read by the next."""
    cache = tmp_path / "cache"
    paths = [shared_tiny(kind)[0] for kind in FAMILIES]
    firsts = _run_child(cache, paths)
    seconds = _run_child(cache, paths)
    assert len(firsts) == len(seconds) == len(FAMILIES)
    for first, second in zip(firsts, seconds, strict=True):
        log = first["log"]
        assert any(m.startswith("Writing jit_decode_loop") for m in log), first
        assert not any("host callbacks" in m for m in log), first
        assert second["tokens"] == first["tokens"]
        hits = [m for m in second["log"] if "cache hit for 'jit_decode_loop'" in m]
        assert hits and not any("MISS" in m for m in second["log"]), second
        assert np.shape(second["tokens"]) == (8,)


def test_a_call_with_concrete_ids_compiles_one_program_without_the_check(
    saved, monkeypatch
):
    import boxwood.models._causal_lm as causal_lm

    model = bm.from_pretrained(saved)
    ids = jnp.asarray(token_ids(3, (6,)))
    program = causal_lm._logits_of_checked_ids
    calls = []

    def spy(*args):
        calls.append(args)
        return program(*args)

    monkeypatch.setattr(causal_lm, "_logits_of_checked_ids", spy)
    model(ids)
    assert len(calls) == 1  # the eager call runs the compiled program
    jax.jit(model)(ids)
    assert len(calls) == 1  # a traced call does not
    with ids_known_in_range():  # as `__call__` traces it
        text = program.lower(model, ids, None, None).as_text()
    assert not _has_callback(text)
    np.testing.assert_allclose(model(ids), jax.jit(model)(ids), rtol=1e-6, atol=1e-6)
    # concrete ids are still checked, eagerly, and a traced call still holds the
    # traced check
    bad = ids.at[2].set(model.config.vocab_size)
    with pytest.raises(ValueError, match="input_ids"):
        model(bad)
    with pytest.raises(boxwood.BoxwoodRuntimeError, match="input_ids"):
        boxwood.filter_jit(model)(bad)
