"""Background saves (`save(..., blocking=False)`) and `boxwood.Checkpointer`."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
from _child_flags import child_env
from boxwood._checkpoint import _background


def test_background_save_copies_first_and_returns_a_handle(tmp_path):
    path = tmp_path / "a.safetensors"
    step = jax.jit(lambda x: x + 1, donate_argnums=0)
    x = jnp.arange(1000.0)
    handle = boxwood.save(path, {"x": x}, blocking=False, metadata={"step": 1})
    x = step(x)  # donates (and on CPU may overwrite) the saved buffer
    handle.wait()
    assert handle.done()
    assert "done" in repr(handle)
    out = boxwood.load(path, {"x": jnp.zeros(1000)})
    np.testing.assert_array_equal(out["x"], np.arange(1000.0))


def test_later_save_waits_for_earlier(tmp_path):
    path = tmp_path / "a.safetensors"
    handles = [
        boxwood.save(path, {"x": jnp.full(3, float(i))}, blocking=False)
        for i in range(5)
    ]
    boxwood.save(path, {"x": jnp.full(3, 9.0)})
    assert all(h.done() for h in handles)
    assert boxwood.load(path, {"x": jnp.zeros(3)})["x"].tolist() == [9, 9, 9]
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"]


def test_background_error_surfaces_at_wait_and_next_call(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("boxwood._checkpoint._save.write_file", fail)
    handle = boxwood.save(
        tmp_path / "a.safetensors", {"x": jnp.ones(1)}, blocking=False
    )
    with pytest.raises(
        RuntimeError, match="background save to .*a.safetensors failed"
    ) as info:
        boxwood.save(tmp_path / "b.safetensors", {"x": jnp.ones(1)})
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(RuntimeError, match="failed"):
        handle.wait()  # the handle still tells
    monkeypatch.undo()
    boxwood.save(tmp_path / "b.safetensors", {"x": jnp.ones(1)})  # reported once


def test_process_exit_waits_for_background_save(tmp_path):
    path = tmp_path / "exit.safetensors"
    code = f"""
        import jax.numpy as jnp, boxwood
        boxwood.save({str(path)!r}, {{"x": jnp.ones(2_000_000)}}, blocking=False)
    """
    env = child_env(PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], check=True, env=env, timeout=120
    )
    assert boxwood.load(path, {"x": jnp.zeros(2_000_000)})["x"].sum() == 2_000_000


def test_checkpointer_keeps_newest_and_resumes(tmp_path):
    ckpt = boxwood.Checkpointer(tmp_path / "run", keep=2)
    assert ckpt.latest_step() is None
    with pytest.raises(boxwood.CheckpointError, match="no checkpoint to restore"):
        ckpt.restore({"w": jnp.zeros(2)})
    for step in (0, 100, 200, 300):
        ckpt.save(
            step,
            {"w": jnp.full(2, float(step))},
            metadata={"loss": 0.5},
            blocking=step % 200 == 0,
        )
    ckpt.wait()
    assert ckpt.all_steps() == [200, 300]
    assert sorted(os.listdir(tmp_path / "run")) == [
        "step_000200.safetensors",
        "step_000300.safetensors",
    ]
    assert ckpt.latest_step() == 300
    assert ckpt.restore({"w": jnp.zeros(2)})["w"].tolist() == [300, 300]
    assert ckpt.restore({"w": jnp.zeros(2)}, step=200)["w"].tolist() == [200, 200]
    assert ckpt.read_metadata() == {"loss": 0.5, "step": 300}
    assert repr(ckpt).endswith("keep=2)")


def test_checkpointer_skips_a_damaged_newest_file(tmp_path):
    ckpt = boxwood.Checkpointer(tmp_path)
    ckpt.save(1, {"w": jnp.ones(4)})
    ckpt.save(2, {"w": jnp.ones(4)})
    data = ckpt.path(2).read_bytes()
    ckpt.path(2).write_bytes(data[:-3])
    with pytest.warns(
        UserWarning,
        match="Skipping a damaged checkpoint: .*step_000002.safetensors.*truncated",
    ):
        assert ckpt.latest_step() == 1


def test_checkpointer_keep_counts_complete_checkpoints_only(tmp_path):
    ckpt = boxwood.Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": jnp.full(4, float(step))})
    data = ckpt.path(3).read_bytes()
    ckpt.path(3).write_bytes(data[:-3])  # the newest file is damaged
    ckpt.save(4, {"w": jnp.full(4, 4.0)})
    # two complete checkpoints remain (2 and 4); the damaged 3 is not one of them
    assert ckpt.all_steps() == [2, 3, 4]
    with pytest.warns(UserWarning, match="Skipping a damaged checkpoint"):
        assert ckpt.restore({"w": jnp.zeros(4)}, step=2)["w"].tolist() == [2.0] * 4
        ckpt.path(4).write_bytes(ckpt.path(4).read_bytes()[:-3])
        assert ckpt.latest_step() == 2  # still one to fall back on
    ckpt.save(5, {"w": jnp.full(4, 5.0)})
    ckpt.save(6, {"w": jnp.full(4, 6.0)})
    assert ckpt.all_steps() == [5, 6]  # older steps, damaged or not, go


def test_checkpointer_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="`keep` must be a positive int"):
        boxwood.Checkpointer(tmp_path, keep=0)
    with pytest.raises(ValueError, match="`step` must be a non-negative int"):
        boxwood.Checkpointer(tmp_path).save(-1, {})


def test_wait_all_with_nothing_pending():
    _background.wait_all()


def test_background_save_survives_delete_and_reuse_of_the_memory(tmp_path):
    """The arrays a background save holds are never overwritten: deleted or donated
    right after the call, their contents still reach the file."""
    path = tmp_path / "big.safetensors"
    a = jnp.arange(4_000_000, dtype=jnp.float32)
    b = jnp.full(4_000_000, 3.0)
    handle = boxwood.save(path, {"a": a, "b": b}, blocking=False)
    a.delete()  # its memory is not given back while the save holds it
    step = jax.jit(lambda x: x * 0 - 1, donate_argnums=0)
    b = step(b)  # donation is skipped while the save holds the buffer
    junk = [jnp.full(4_000_000, -7.0) for _ in range(4)]  # reuse freed memory
    jax.block_until_ready(junk)
    handle.wait()
    out = boxwood.load(path, {"a": jnp.zeros(4_000_000), "b": jnp.zeros(4_000_000)})
    np.testing.assert_array_equal(out["a"], np.arange(4_000_000, dtype=np.float32))
    assert out["b"].min() == out["b"].max() == 3.0
    assert b.min() == -1.0


def test_background_save_copies_numpy_leaves(tmp_path):
    path = tmp_path / "np.safetensors"
    x = np.ones(3_000_000, np.float32)
    handle = boxwood.save(path, {"x": x}, blocking=False)
    x[:] = 5.0  # changed in place right after the call
    handle.wait()
    assert boxwood.load(path, {"x": x})["x"].max() == 1.0


def test_wait_with_a_timeout_raises_while_the_save_runs(tmp_path, monkeypatch):
    import threading

    from boxwood._checkpoint import _safetensors

    release = threading.Event()
    real = _safetensors.write_arrays

    def slow_write(*args, **kwargs):
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(_safetensors, "write_arrays", slow_write)
    path = tmp_path / "slow.safetensors"
    handle = boxwood.save(path, {"w": jnp.ones(3)}, blocking=False)
    try:
        with pytest.raises(
            TimeoutError, match=r"The background save to .*slow.safetensors is still"
        ):
            handle.wait(timeout=0.05)
        assert not handle.done()
    finally:
        release.set()
    handle.wait()
    assert boxwood.load(path, {"w": jnp.zeros(3)})["w"].tolist() == [1, 1, 1]


def test_a_file_cut_short_while_loading_is_reported(tmp_path, monkeypatch):
    from boxwood._checkpoint import _safetensors

    path = tmp_path / "cut.safetensors"
    boxwood.save(path, {"w": jnp.arange(1000.0)})
    real = _safetensors.aligned_empty

    def truncate_then_allocate(*args, **kwargs):
        with open(path, "r+b") as f:  # another process rewrote the file meanwhile
            f.truncate(path.stat().st_size - 400)
        return real(*args, **kwargs)

    monkeypatch.setattr(_safetensors, "aligned_empty", truncate_then_allocate)
    with pytest.raises(
        boxwood.CheckpointError,
        match=r"cut.safetensors: the file changed while loading",
    ):
        boxwood.load(path, {"w": jnp.zeros(1000)})
