"""Test configuration: 8 virtual CPU devices, set before jax is imported.

PJRT_NPROC lifts XLA's cap on queued executions per device (see the README's
"sharp bits"); tests that queue many asynchronous steps would otherwise
deadlock lax.psum and jax_blink.psum alike.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("PJRT_NPROC", "64")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
