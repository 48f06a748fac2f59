"""Every planning test gets its own empty plan cache (disk and process)."""

import pytest

from jax_blink.planning import clear_memory_cache


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path / "cache"))
    clear_memory_cache()
    yield
    clear_memory_cache()
