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
