"""What makes the suite pass on backends other than the CPU, checked on the CPU by
simulating them: a failed `error_if` check recovered whatever the backend's report
says, results waited for where dispatch is asynchronous, float32 exactness tests
at full matmul precision, initialisers' scalar factors computed by the backend's
own arithmetic, and a multi-process test's reference on its workers' platform."""

import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood as bw
from _precision import highest_matmul_precision  # noqa: F401
from boxwood import _errors
from boxwood._init import _jax_initializers

TESTS = Path(__file__).resolve().parents[1]


def _report(text="INTERNAL: GpuCallback error calling callback"):
    """A backend's report of a failed host callback without the check's text."""
    return jax.errors.JaxRuntimeError(text)


def _fail_under_plain_jit(message):
    """A real failed check under `jax.jit`, caught as the user would: its record
    stays in the log, unclaimed."""
    f = jax.jit(lambda x: bw.error_if(x, x < 0, message))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(f(jnp.array(-1.0)))


# ------------------------------------------------------------- failed checks
def test_a_report_without_the_marker_claims_the_failure_of_its_call():
    since = _errors.failure_mark()
    _fail_under_plain_jit("claimed by its call")
    with pytest.raises(bw.BoxwoodRuntimeError, match="^claimed by its call") as info:
        _errors.raise_as_boxwood_error(_report(), since)
    assert "BOXWOOD_ON_ERROR=breakpoint" in str(info.value)
    # claimed once: the same report again is left alone
    assert _errors.as_boxwood_error(_report(), since) is None


def test_a_report_naming_the_message_claims_it_without_a_mark():
    _fail_under_plain_jit("named in the report")
    text = "INTERNAL: callback failed: named in the report"
    recovered = _errors.as_boxwood_error(_report(text))
    assert isinstance(recovered, bw.BoxwoodRuntimeError)
    assert str(recovered).startswith("named in the report\n\nThe check that failed")


def test_a_stale_failure_never_attaches_to_an_unrelated_error():
    _fail_under_plain_jit("stale failure")
    since = _errors.failure_mark()  # a later call begins
    assert _errors.as_boxwood_error(_report(), since) is None  # nothing after it
    assert _errors.as_boxwood_error(_report()) is None  # no mark, no message
    unrelated = RuntimeError("stale failure, an unrelated error of the same words")
    assert _errors.as_boxwood_error(unrelated, 0) is None
    assert _errors.as_boxwood_error(KeyError("callback stale failure")) is None


def test_filter_jit_recovers_the_message_when_the_report_lacks_the_marker(
    monkeypatch,
):
    monkeypatch.setattr(_errors, "_MARKER", "\x00 a marker no report carries \x00")
    f = bw.filter_jit(lambda x: bw.error_if(x, x < 0, "negative, GPU-style"))
    f(jnp.ones(2))
    for _ in range(2):  # cold and warm call paths
        with pytest.raises(bw.BoxwoodRuntimeError, match="^negative, GPU-style"):
            jax.block_until_ready(f(-jnp.ones(2)))


def test_other_callback_errors_are_left_alone_without_the_marker(monkeypatch):
    monkeypatch.setattr(_errors, "_MARKER", "\x00 a marker no report carries \x00")

    def fail(x):
        raise KeyError("not a check")

    g = bw.filter_jit(
        lambda x: jax.pure_callback(fail, jax.ShapeDtypeStruct((), jnp.float32), x)
    )
    with pytest.raises(Exception, match="not a check") as info:
        jax.block_until_ready(g(jnp.ones(())))
    assert not isinstance(info.value, bw.BoxwoodRuntimeError)


def test_the_log_is_bounded_and_safe_across_threads():
    log = _errors._FailedChecks(bound=8)
    messages = [f"thread {i} failed" for i in range(8)]
    threads = [threading.Thread(target=log.record, args=(m,)) for m in messages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [log.claim(f"callback error: {m}", None) for m in messages]
    assert claimed == messages and log.claim("callback", 0) is None
    for i in range(20):
        log.record(f"old {i}")
    assert log.claim("callback: old 3", None) is None  # dropped by the bound
    assert log.claim("callback: old 19", None) == "old 19"


def test_checks_in_threads_each_raise_their_own_message():
    f = bw.filter_jit(lambda x, m: bw.error_if(x, x < 0, m))
    errors = {}

    def run(i):
        try:
            for _ in range(3):
                jax.block_until_ready(f(-jnp.ones(2), f"thread {i}"))
        except bw.BoxwoodRuntimeError as error:
            errors[i] = str(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(errors) == [0, 1, 2, 3]
    assert all(errors[i].startswith(f"thread {i}") for i in errors)


def test_on_error_nan_records_nothing():
    since = _errors.failure_mark()
    out = jax.jit(lambda x: bw.error_if(x, x < 0, "m", on_error="nan"))(-jnp.ones(2))
    assert jnp.isnan(out).all() and _errors.failure_mark() == since


# These simulate an asynchronous backend on the CPU, where a compiled call's
# failure arrives with the call.
simulated = pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="simulates an asynchronous backend on the CPU",
)


def _swallowing(jitted):
    """`jitted` as an asynchronous backend calls it: the call returns before its
    computation fails (on the CPU the failure arrives with the call)."""

    def call(*args):
        try:
            return jitted(*args)
        except (jax.errors.JaxRuntimeError, ValueError) as error:
            call.errors.append(error)
            return None

    call.errors = []
    return call


def _checked(message):
    from boxwood._jit import _checked_jit as _checks

    fn = lambda x: bw.error_if(x, x < 0, message)  # noqa: E731
    checked = _checks.CheckedJit(fn, {})
    checked.jitted = _swallowing(checked.jitted)
    return checked


@simulated
def test_a_failed_check_raises_at_the_next_call_without_waiting(monkeypatch):
    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or x)
    checked = _checked("x must be >= 0, async")
    checked(jnp.ones(2))
    assert checked(-jnp.ones(2)) is None  # queued: the failure is not seen yet
    assert checked.failed  # noted by the check's host callback
    with pytest.raises(bw.BoxwoodRuntimeError, match="^x must be >= 0, async") as info:
        checked(jnp.ones(2))  # the next call raises it before it runs
    assert "BOXWOOD_ON_ERROR=breakpoint" in str(info.value)
    np.testing.assert_array_equal(checked(jnp.ones(2)), jnp.ones(2))  # once
    assert waited == []


@simulated
def test_a_failure_claimed_at_a_wait_is_not_raised_again():
    checked = _checked("claimed where waited for")
    checked(-jnp.ones(2))
    # the program waited first and recovered the check's error from JAX's report
    recovered = _errors.as_boxwood_error(checked.jitted.errors[0])
    assert str(recovered).startswith("claimed where waited for\n\nThe check that")
    np.testing.assert_array_equal(checked(jnp.ones(2)), jnp.ones(2))


@simulated
def test_a_dispatch_refused_after_a_failure_raises_the_failure():
    checked = _checked("noted while dispatching")
    serial = _errors._FAILED.record("noted while dispatching")

    def refuse(*args):
        checked.failed = serial  # the host callback notes it as the call is queued
        raise jax.errors.JaxRuntimeError("INTERNAL: an input buffer holds an error")

    checked.jitted = refuse
    with pytest.raises(bw.BoxwoodRuntimeError, match="^noted while dispatching"):
        checked(jnp.ones(2))


def test_the_outermost_owner_notes_a_nested_check():
    class Owner:
        failed = 0

    outer, inner = Owner(), Owner()
    x = -jnp.ones(2)
    with _errors.note_failures(outer), _errors.note_failures(inner):
        fresh = lambda y: bw.error_if(y, y < 0, "nested check")  # noqa: E731
        compiled = jax.jit(fresh).lower(x).compile()
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match="nested"):
        jax.block_until_ready(compiled(x))
    assert outer.failed and not inner.failed
    _errors._FAILED.take(outer.failed)
    # Off the CPU the device keeps the token of its last program with a host
    # callback, and `jax.effects_barrier()` raises that program's failure: a
    # passing run replaces it (else a later test's barrier raised "nested check").
    jax.block_until_ready(compiled(-x))


@simulated
def test_off_the_cpu_filter_jit_never_waits(monkeypatch):
    from boxwood._jit import _checked_jit as _checks

    monkeypatch.setattr(_checks.jax, "default_backend", lambda: "tpu")
    monkeypatch.delenv("BOXWOOD_SYNC_CHECKS", raising=False)
    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or x)

    @bw.filter_jit
    def checked(x):
        return bw.error_if(x, x < 0, "x must be >= 0")

    checked(jnp.array(1.0))
    checked(jnp.array(2.0))  # warm
    assert waited == []
    with pytest.raises(bw.BoxwoodRuntimeError, match="x must be >= 0"):
        checked(jnp.array(-1.0))  # (the CPU fails it during the call)


@simulated
def test_sync_checks_wait_for_every_call_of_a_function_with_a_check(monkeypatch):
    from boxwood._jit import _checked_jit as _checks

    monkeypatch.setattr(_checks.jax, "default_backend", lambda: "tpu")
    monkeypatch.setenv("BOXWOOD_SYNC_CHECKS", "1")
    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or x)
    checked = bw.filter_jit(lambda x: bw.error_if(x, x < 0, "x must be >= 0"))
    checked(jnp.ones(2))
    checked(jnp.ones(2))
    assert len(waited) == 2
    # no check in its program: nothing to raise, so the call returns at once
    plain = bw.filter_jit(lambda x: x + 1)
    plain(jnp.ones(2))
    plain(jnp.ones(2))
    assert len(waited) == 2
    # a later trace that adds a check makes every call from then on wait
    maybe = bw.filter_jit(lambda x: bw.error_if(x, x < 0, "negative") if x.ndim else x)
    maybe(jnp.ones(()))
    assert len(waited) == 2
    maybe(jnp.ones(2))
    maybe(jnp.ones(()))
    assert len(waited) == 4
    # a `filter_jit` function's check inside another's program: the outer waits
    outer = bw.filter_jit(lambda x: checked(x) + 1)
    outer(jnp.ones(2))
    assert len(waited) == 5


def test_on_the_cpu_the_inner_jit_is_not_wrapped(monkeypatch):
    from boxwood._jit import _checked_jit as _checks

    monkeypatch.setattr(_checks.jax, "default_backend", lambda: "cpu")
    assert not isinstance(_checks.checked_jit(lambda x: x, {}), _checks.CheckedJit)
    monkeypatch.setattr(_checks.jax, "default_backend", lambda: "gpu")
    assert isinstance(_checks.checked_jit(lambda x: x, {}), _checks.CheckedJit)


# ------------------------------------------------------------------ precision
EXACTNESS_MODULES = [
    "test_models_exactness",
    "test_models_generate",
    "test_models_generate_batch",
    "test_torch_parity_stateful",
    "test_checkpoint_torch",
    "test_nn_attention",
    "test_nn_norms",
    "test_remat",
    "test_equinox_differential_nn",
    "test_models_export",
]


@pytest.mark.parametrize("name", EXACTNESS_MODULES)
def test_exactness_modules_pin_highest_matmul_precision(name):
    (path,) = TESTS.rglob(f"{name}.py")
    text = path.read_text()
    assert 'pytestmark = pytest.mark.usefixtures("highest_matmul_precision")' in text


@pytest.mark.usefixtures("highest_matmul_precision")
def test_the_fixture_sets_highest_precision_for_compiled_products():
    assert jax.config.jax_default_matmul_precision == "highest"
    a = jnp.ones((4, 4))
    assert "HIGHEST" in jax.jit(jnp.dot).lower(a, a).as_text()


@pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="off the CPU every test runs at highest precision (conftest.py)",
)
def test_without_the_fixture_the_default_precision_holds():
    assert jax.config.jax_default_matmul_precision is None


# --------------------------------------------------------------- initialisers
inits = jax.nn.initializers


def test_scalar_factors_use_numpy_on_the_cpu():
    assert _jax_initializers._scalar_arithmetic() is (
        np if jax.default_backend() == "cpu" else jnp
    )


@pytest.mark.parametrize(
    "fn",
    [inits.lecun_normal(), inits.he_uniform(), inits.glorot_normal(),
     inits.variance_scaling(1.0, "fan_avg", "truncated_normal")],
)  # fmt: skip
def test_the_backend_arithmetic_factor_gives_the_direct_bits(monkeypatch, fn):
    # off the CPU the factor is computed with jax.numpy, as the direct call does:
    # on the CPU both routes give the direct call's bits
    monkeypatch.setattr(_jax_initializers, "_scalar_arithmetic", lambda: jnp)
    for shape in [(128, 32), (48, 12), (3, 3, 8, 16)]:
        fast = _jax_initializers.fast_call(fn, jr.key(3), shape, jnp.float32)
        direct = fn(jr.key(3), shape, jnp.float32)
        assert np.asarray(fast).tobytes() == np.asarray(direct).tobytes()


# ------------------------------------------------------------ multi-process
def test_the_two_process_reference_runs_on_the_cpu(monkeypatch):
    import _sharding_cases

    want = _sharding_cases.reference_on_cpu()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    placed = []
    real = jax.default_device

    def recording(device):
        placed.append(device.platform)
        return real(device)

    monkeypatch.setattr(jax, "default_device", recording)
    got = _sharding_cases.reference_on_cpu()
    assert placed == ["cpu"]
    np.testing.assert_array_equal(got[0], want[0])
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_array_equal(a, b)
