"""`boxwood.enable_compilation_cache`: small kernels are written to the folder."""

import jax
import jax.numpy as jnp
import pytest

import boxwood

_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def restore_settings():
    saved = {name: getattr(jax.config, name) for name in _SETTINGS}
    yield
    boxwood.disable_compilation_cache()
    for name, value in saved.items():
        jax.config.update(name, value)


def test_enable_writes_small_kernels(tmp_path, restore_settings):
    folder = boxwood.enable_compilation_cache(tmp_path / "cache")
    assert folder == tmp_path / "cache" and folder.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(folder)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    # A tiny kernel (well under JAX's default 1 s threshold) is kept.
    jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0)).block_until_ready()
    assert any(folder.iterdir())
    boxwood.disable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir is None


def test_default_folder(monkeypatch, tmp_path, restore_settings):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = boxwood.enable_compilation_cache()
    assert folder == tmp_path / "boxwood" / "jax" and folder.is_dir()


def test_a_raising_check_traced_with_the_cache_on_warns_once(
    tmp_path, restore_settings, monkeypatch
):
    """A raising check's host callback keeps its program out of the persistent
    cache (JAX says so only in a debug log): with the cache on, tracing one
    warns once per process, naming the check and the fix; without the cache,
    or with a check that does not raise, nothing is said."""
    import threading

    from boxwood import _compilation_cache

    monkeypatch.setattr(_compilation_cache, "_UNCACHED_WARNED", threading.Event())
    checked = lambda x: boxwood.error_if(x, x < 0, "x must not be negative")  # noqa: E731
    boxwood.filter_jit(checked)(jnp.ones(3))  # the cache off: silent
    filled = lambda x: boxwood.error_if(x, x < 0, "negative", on_error="nan")  # noqa: E731
    boxwood.enable_compilation_cache(tmp_path / "cache")
    boxwood.filter_jit(filled)(jnp.ones(3))  # no callback: silent
    with pytest.warns(boxwood.PerformanceWarning, match="BOXWOOD_ON_ERROR=nan") as seen:
        boxwood.filter_jit(checked)(jnp.ones(2))
    assert len(seen) == 1 and "x must not be negative" in str(seen[0].message)
    assert seen[0].filename == __file__  # the caller's line
    boxwood.filter_jit(lambda x: checked(x) * 2)(jnp.ones(2))  # once per process
