"""What the ops tests on 8 CPU devices share: the device count, 64-bit types
switched on for a test module (import ``x64`` into it: an autouse fixture),
and a 1-D mesh named "x"."""

import numpy as np
import pytest

import jax

N = 8


@pytest.fixture(scope="module", autouse=True)
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def mesh1d(devices=None):
    devices = jax.devices()[:N] if devices is None else devices
    return jax.sharding.Mesh(np.asarray(devices), ("x",))
