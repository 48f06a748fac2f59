"""Which process owns each device of a collective, seen at trace time.

A jax job of several processes (``jax.distributed``) runs each process's
devices in that process only: the in-process executor must never wait for a
device of another process. Inside ``shard_map`` jax shows only the abstract
mesh (axis names and sizes), so the device of a mesh position is taken to be
the one ``jax.make_mesh`` puts there: the mesh's positions in row-major order
are ``jax.devices()`` in order, process by process (``jax.make_mesh`` reshapes
``jax.devices()`` on CPU and sorts GPUs by id; ids are numbered process by
process). The layout is computed from public, process-independent facts
(``jax.devices()``, the abstract mesh), so every process decides the same.

:func:`layout` answers, for a call over ``axes`` (with lax's
``axis_index_groups``, if any):

* ``None``: one process owns every group's devices (a single-process job, or a
  process-local axis): the in-process path;
* a :class:`HostLocal` layout: each group's devices live in several processes
  of one host whose shared memory transport is ready (:mod:`jax_blink.processes.transport`):
  the same path, its ranks meeting in shared memory;
* a :class:`Spanning` layout the hierarchical path serves (Blink's
  multi-server protocol: reduce-scatter inside each process, an allreduce of
  each shard across processes by XLA, all-gather inside each process);
* a string: why neither applies (the caller falls back to lax).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Optional, Union

import numpy as np

import jax

from jax_blink import settings

__all__ = ["Spanning", "HostLocal", "layout", "layout_of", "process_of_positions", "check_lowered_mesh"]


@dataclasses.dataclass(frozen=True)
class Spanning:
    """A call whose devices span processes, in the shape the hierarchical path
    serves. Ranks are linear indices over the call's axes (row-major).

    ``local_axes``/``cross_axes``: when every axis is either inside a process
    or across processes (a mesh such as ``("host", "local")``), the in-process
    phases run over ``local_axes`` and the cross-process allreduce over
    ``cross_axes``; ``groups`` and ``cross_groups`` are then None. Otherwise
    (one axis whose devices form equal contiguous runs per process)
    ``groups`` are the in-process groups of the axis and ``cross_groups`` the
    groups of equal position across processes.
    """

    nprocesses: int                    # processes (hosts) among which each call's devices are split
    per_process: int                   # devices of the call in each process (host)
    local_axes: Optional[tuple] = None
    cross_axes: Optional[tuple] = None
    groups: Optional[tuple] = None
    cross_groups: Optional[tuple] = None
    #: "process", or "host" where the units are hosts whose processes share memory (the
    #: in-host phases then run over the host transport)
    unit: str = "process"

    @property
    def units(self) -> str:
        return "processes" if self.unit == "process" else "hosts"

    def describe(self) -> str:
        inside, across = ("in-process" if self.unit == "process" else "in-host"), self.units
        if self.local_axes is not None:
            return (f"{self.nprocesses} {across} x {self.per_process} devices: {inside} "
                    f"over {self.local_axes}, across {across} over {self.cross_axes}")
        return (f"{self.nprocesses} {across} x {self.per_process} devices: {inside} "
                f"groups {[list(g) for g in self.groups]}")


@dataclasses.dataclass(frozen=True)
class HostLocal:
    """A call whose groups each span several processes of one host: it runs
    as one schedule over all of a group's devices, over shared memory."""

    nprocesses: int   # processes of the largest group
    # The process (0, 1, ... in order of first appearance) of each rank over the
    # reduced axes, the same in every row of the mesh, where some process holds
    # several of them; else None. The call is then planned on
    # topo.presets.shm_processes of it (trees reduce within a process before
    # crossing), not on shm:N.
    ranks_process: Optional[tuple] = None

    def describe(self) -> str:
        return f"{self.nprocesses} processes"


def process_of_positions(axis_sizes, devices) -> np.ndarray:
    """The process index of every mesh position (an array of the mesh's
    shape), for a mesh laid out as ``jax.make_mesh`` lays out ``devices``."""
    return np.asarray([d.process_index for d in devices]).reshape(tuple(axis_sizes))


def layout(axes: tuple, groups=None) -> Union[None, HostLocal, Spanning, str]:
    """The process layout of a call over ``axes`` (see the module docstring)."""
    if jax.process_count() == 1:
        return None
    mesh = jax.sharding.get_abstract_mesh()
    key = (tuple(mesh.axis_names), tuple(mesh.axis_sizes), tuple(axes),
           None if groups is None else tuple(tuple(g) for g in groups))
    found = _layout(*key)
    if found is None or not settings.host_transport() or jax.default_backend() != "cpu":
        return found
    return _host_local(*key) or _host_spanning(*key) or found


@functools.lru_cache(maxsize=256)
def _layout(names, sizes, axes, groups):
    """:func:`layout` of a mesh over ``jax.devices()`` (fixed for the job),
    computed once per mesh, axes and groups: a multi-process psum asks for
    the same layout once per phase and per trace."""
    devices = _mesh_devices(sizes)
    if devices is None:
        return (f"the mesh has {int(np.prod(sizes))} devices of the job's {jax.device_count()}, "
                "so which process owns which device is unknown (jax_blink assumes a mesh over "
                "jax.devices() in order, as jax.make_mesh builds it)")
    return layout_of(process_of_positions(sizes, devices), names, axes, groups)


def _mesh_devices(sizes):
    """``jax.devices()`` in id order, the mesh's devices as jax.make_mesh lays them out; None
    when the mesh holds another number of devices (then :func:`_layout` says why)."""
    devices = sorted(jax.devices(), key=lambda d: d.id)
    return devices if int(np.prod(sizes)) == len(devices) else None


def _rank_table(owner, names, axes, groups):
    """``(table, members)``: the owners of a call's devices, a row per combination of the
    other mesh axes and a column per rank over ``axes``, and the call's groups of ranks (all
    of them when ``groups`` is None)."""
    order = [names.index(a) for a in axes]
    others = [i for i in range(len(names)) if i not in order]
    table = np.transpose(owner, others + order).reshape(
        -1, int(np.prod([owner.shape[i] for i in order])))
    members = [list(g) for g in groups] if groups is not None else [list(range(table.shape[1]))]
    return table, members


@functools.lru_cache(maxsize=256)
def _host_spanning(names, sizes, axes, groups) -> Optional[Spanning]:
    """The hierarchical layout with hosts as its units, when the call's devices span hosts
    and every host's processes share memory: its in-host phases then run over the host
    transport (:class:`HostLocal`). None where that does not apply."""
    from jax_blink.processes.transport import hosts

    devices = _mesh_devices(sizes)
    found = hosts()
    if devices is None or found.reason is not None or groups is not None:
        return None
    owner = np.asarray(found.host_of)[process_of_positions(sizes, devices)]
    span = layout_of(owner, names, axes, None)
    return dataclasses.replace(span, unit="host") if isinstance(span, Spanning) else None


@functools.lru_cache(maxsize=256)
def _host_local(names, sizes, axes, groups) -> Optional[HostLocal]:
    """A :class:`HostLocal` layout when every group's processes share one host
    whose transport is ready, else None."""
    from jax_blink.processes.transport import hosts

    devices = _mesh_devices(sizes)
    if devices is None:
        return None  # _layout says why
    found = hosts()
    table, members = _rank_table(process_of_positions(sizes, devices), names, axes, groups)
    most = 0
    for row in table:
        for g in members:
            processes = sorted({int(p) for p in row[g]})
            if found.one_host(processes) is None:
                return None
            most = max(most, len(processes))
    labels = {tuple(list(dict.fromkeys(row.tolist())).index(p) for p in row.tolist()) for row in table}
    shared = len(labels) == 1 and len(set(next(iter(labels)))) < table.shape[1]
    return HostLocal(most, next(iter(labels)) if shared else None)


def check_lowered_mesh(axis_context) -> None:
    """Refuse, when lowering, a multi-process mesh that is not ``jax.devices()`` in order.

    :func:`layout` decided which devices share a process from the abstract
    mesh, assuming the layout of ``jax.make_mesh``. The lowering rule sees the
    concrete mesh (``axis_context.mesh``, where this jax provides it): if its
    devices are in another order, the in-process groups would hold devices of
    other processes and the executor would wait for them until its timeout,
    so this raises at once instead. Where jax gives no concrete mesh the
    assumption stands unchecked.

    Raises
    ------
    ValueError
        Naming the mesh's device order and what to do.
    """
    if jax.process_count() == 1:
        return
    devices = getattr(getattr(axis_context, "mesh", None), "devices", None)
    if devices is None:
        return
    ids = [d.id for d in np.asarray(devices).flat]
    expected = sorted(d.id for d in jax.devices())
    if len(ids) == len(expected) and ids != expected:
        raise ValueError(
            f"jax_blink: the mesh's devices (ids {ids[:16]}{' ...' if len(ids) > 16 else ''} in mesh order) are "
            f"not jax.devices() in id order, which jax_blink assumes across processes to know which devices "
            f"share a process (inside shard_map jax shows only the abstract mesh). Build the mesh with "
            f"jax.make_mesh (or a Mesh over jax.devices() in order), or use lax's collectives on this mesh.")


def layout_of(owner: np.ndarray, names: tuple, axes: tuple, groups=None):
    """:func:`layout` for a mesh with axes ``names`` whose position ``p`` is
    owned by process ``owner[p]``."""
    table, members = _rank_table(owner, names, axes, groups)
    if all(len(set(row[g])) == 1 for row in table for g in members):
        return None  # every group inside one process
    if groups is not None:
        return ("axis_index_groups whose devices span processes: the hierarchical path takes "
                "whole axes only")
    return _spanning(axes, [owner.shape[names.index(a)] for a in axes], table)


def _spanning(axes, axis_sizes, table) -> Union[Spanning, str]:
    """The hierarchical layout of ranks whose processes are ``table``'s rows."""
    runs = []
    for row in table:
        by_process = {}
        for rank, p in enumerate(row):
            by_process.setdefault(int(p), []).append(rank)
        runs.append(tuple(tuple(v) for v in by_process.values()))
    if len(set(runs)) != 1:
        return ("the reduced devices are split among processes differently for different "
                "devices of the other mesh axes")
    groups = runs[0]
    k = len(groups[0])
    if any(len(g) != k for g in groups):
        return (f"the processes own different numbers of the reduced devices "
                f"({[len(g) for g in groups]})")
    if k == 1:
        return ("each process owns one of the reduced devices: nothing to reduce inside a "
                "process")
    # whole axes inside or across processes?
    coords = np.asarray(list(itertools.product(*[range(s) for s in axis_sizes])))
    proc = table[0]
    local, cross = [], []
    for i, a in enumerate(axes):
        others = [j for j in range(len(axes)) if j != i]
        keys = [tuple(c[others]) for c in coords]
        lines = {}
        for key, p in zip(keys, proc):
            lines.setdefault(key, []).append(int(p))
        if all(len(set(v)) == 1 for v in lines.values()):
            local.append(a)
        elif all(len(set(v)) == len(v) for v in lines.values()):
            cross.append(a)
    local_size = int(np.prod([axis_sizes[axes.index(a)] for a in local])) if local else 0
    if local and cross and len(local) + len(cross) == len(axes) and local_size == k:
        return Spanning(len(groups), k, local_axes=tuple(local), cross_axes=tuple(cross))
    if len(axes) == 1 and all(list(g) == list(range(g[0], g[0] + k)) for g in groups):
        cross_groups = tuple(tuple(g[j] for g in groups) for j in range(k))
        return Spanning(len(groups), k, groups=tuple(groups), cross_groups=cross_groups)
    return (f"the devices of {axes} are spread over processes in a way the hierarchical path "
            "does not take (it takes whole process-local and cross-process axes, or one axis "
            "in equal contiguous runs per process)")
