"""Topology of the live machine: the only module of jax_blink that touches hardware.

It runs ``nvidia-smi topo -m`` when the tool exists and parses the matrix with
:meth:`jax_blink.topology.Topology.from_nvidia_smi`. Pure Python: never
imports jax.
"""

from __future__ import annotations

import shutil
import subprocess

from jax_blink.topology import Topology

__all__ = ["detect"]


def detect(timeout_s: float = 10.0, **bandwidths) -> Topology | None:
    """The GPU topology of this machine, or None where ``nvidia-smi`` is absent or fails.

    Parameters
    ----------
    timeout_s : float
        How long to wait for ``nvidia-smi``.
    **bandwidths
        Passed to :meth:`Topology.from_nvidia_smi` (``nvlink_gbps``,
        ``pcie_gbps``, ``sys_gbps``): ``nvidia-smi topo -m`` shows link
        counts, not speeds.

    Raises
    ------
    jax_blink.topology.TopologyError
        If ``nvidia-smi`` ran but printed a matrix that cannot be parsed.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        result = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return Topology.from_nvidia_smi(result.stdout, name="detected", **bandwidths)
