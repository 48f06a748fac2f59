"""The choice across hosts: whether Blink's phases (an in-process reduce-scatter or
all-gather on Blink's trees, NCCL's collective of each GPU's shard across the processes:
:mod:`jax_blink.ops.hierarchical`) or NCCL over all the call's GPUs is predicted faster,
on GPUs, by NCCL's tuner model and the CUDA executor's predictions
(:mod:`jax_blink.choice.predict_gpu`).
"""

from __future__ import annotations

import functools

from jax_blink import settings
from jax_blink.choice import predict_gpu
from jax_blink.choice.requests import PlanRequest, launch_s, topology_for, tuned_on_gpu
from jax_blink.schedule import DTYPES
from jax_blink.sim import nccl as nccl_model
from jax_blink.topo.presets import gpu_of

__all__ = ["across_hosts", "phases_name"]

def across_hosts(groups, processes: int, per_process: int, *, collective: str = "allreduce",
                 topology=None, chunks=None):
    """``(lax_faster, why)``: whether NCCL over all the call's GPUs is predicted faster than
    Blink's phases across processes (:mod:`jax_blink.ops.hierarchical`), for ``collective``
    (``"allreduce"``, ``"reduce_scatter"`` or ``"allgather"``) of ``groups`` (``(count,
    dtype)`` per dtype group, each its own collective; ``count``: the elements of each
    device's input), ``per_process`` GPUs in each of ``processes`` processes, each process
    taken as a host reaching the network at ``JAX_BLINK_NETWORK_GBPS``, else at the
    bandwidth found in sysfs (:func:`jax_blink.topo.detect.detect_network_gbps`).

    The phases: the in-process reduce-scatter and all-gather that will run (the schedules
    of :func:`schedule_for`, simulated, with the CUDA executor's costs, or NCCL's own where
    that is predicted faster), and across the processes NCCL's collective of each GPU's
    shard, one GPU per host on its share of the host's network (``sim.nccl.predict_hosts``,
    ``predict_collective_hosts``):

    * allreduce: reduce-scatter inside, allreduce of the shard across, all-gather inside;
    * reduce-scatter: reduce-scatter inside, reduce-scatter of the shard across;
    * all-gather: all-gather across, all-gather inside of the gathered blocks.

    lax: NCCL's collective over every GPU (the same model). Where the network bandwidth is
    unknown or the topology names no GPU there is no prediction: the phases run, as ``why``
    says. Each group's times add up, on each side."""
    if collective not in _PHASES:
        raise ValueError(f"across_hosts: no phases for {collective!r}; use allreduce, reduce_scatter or allgather")
    groups = tuple((count, dtype) for count, dtype in groups if count and dtype in DTYPES)
    if not groups:  # the in-process phases leave these to lax
        return False, "no prediction across hosts: no value of a dtype jax_blink reduces"
    network, source = settings.network_gbps(), "JAX_BLINK_NETWORK_GBPS"
    if network is None:
        found = _detected_network()
        if found is not None:
            network, source = found[0], f"found in sysfs: {found[1]}"
    host = topology_for(topology, per_process)
    if network is None:
        return False, ("no prediction across hosts: no network found in sysfs; set "
                       "JAX_BLINK_NETWORK_GBPS to each host's network bandwidth to compare with "
                       "NCCL over all GPUs")
    if gpu_of(host) is None:
        return False, f"no prediction across hosts: no NCCL model for {host.name} (it names no GPU)"
    return _across_hosts(groups, processes, host, network, settings.chunks(chunks), source, collective)


#: Per collective across hosts: the in-process phase before the processes' collective, the
#: collective across them, and the in-process phase after (None: none).
_PHASES = {"allreduce": ("reduce_scatter", "allreduce", "allgather"),
           "reduce_scatter": ("reduce_scatter", "reduce_scatter", None),
           "allgather": (None, "allgather", "allgather")}
_PHASE_NAMES = {"reduce_scatter": "reduce-scatter", "allreduce": "allreduce", "allgather": "all-gather"}


def phases_name(collective: str) -> str:
    """How explain() names the phases of ``collective`` across hosts: "three phases" for the
    allreduce, "two phases" for the reduce-scatter and all-gather (see :data:`_PHASES`)."""
    return f"{'three' if all(_PHASES[collective]) else 'two'} phases"


@functools.lru_cache(maxsize=1)
def _detected_network():
    """:func:`jax_blink.topo.detect.detect_network_gbps`, once per process."""
    from jax_blink.topo.detect import detect_network_gbps

    return detect_network_gbps()


@functools.lru_cache(maxsize=64)
def _across_hosts(groups, processes, host, network, chunks, source, collective):
    """:func:`across_hosts`, predicted."""
    k = host.n
    before, across, after = _PHASES[collective]
    phases, lax = [0.0, 0.0, 0.0], 0.0
    one = host.subset([0])
    for count, dtype in groups:
        item = DTYPES[dtype][1]
        # elements (as NCCL counts them: a reduce-scatter's or all-gather's whole vector) of the
        # in-process phases, of the collective across the hosts, and of lax's over all GPUs
        if collective == "allreduce":
            local = -(-count // k) * k  # padded to a multiple of k
            shard, whole = local // k, count
        elif collective == "reduce_scatter":
            local, shard, whole = count, count // k, count
        else:  # the all-gather gathers the processes' blocks across, then the k devices' inside
            local = whole = count * processes * k
            shard = count * processes
        for i, phase in ((0, before), (2, after)) if k > 1 else ():
            if phase is not None:
                request = tuned_on_gpu(PlanRequest(host, chunks, launch_s("gpu"), phase), "gpu")
                phases[i] += predict_gpu.seconds(request, local, dtype)
        phases[1] += nccl_model.predict_collective_hosts(one, processes, network / k, across, shard * item).seconds
        lax += nccl_model.predict_collective_hosts(host, processes, network, collective, whole * item).seconds
    ours = sum(phases)
    parts = ", ".join(f"{label} {t * 1e6:.4g}" for label, t in (
        (f"in-process {_PHASE_NAMES[before]}" if before else None, phases[0]),
        (f"across {processes} hosts", phases[1]),
        (f"{_PHASE_NAMES[after]}" if after else None, phases[2])) if label)
    name = phases_name(collective)
    times = (f"{name} {ours * 1e6:.4g} us ({parts}), NCCL over all {processes * k} GPUs {lax * 1e6:.4g} us; "
             f"{network:g} GB/s per host ({source}), NCCL by its tuner's model")
    if lax <= ours:
        return True, f"predicted faster than the {name}: {times}"
    return False, f"predicted fastest: {times}"


