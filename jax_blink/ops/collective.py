"""One collective call over a pytree: the machinery every op shares.

An op (:func:`~jax_blink.psum`, :func:`~jax_blink.psum_scatter`, ...) turns
each leaf into a 2-D block ``(shards, m)`` (``shards`` is the number of
devices for reduce_scatter's input and allgather's output, else 1) and calls
:func:`run`, which

1. checks the dtypes (widening the small integer types and bool losslessly,
   splitting complex values into their real and imaginary parts),
2. types each leaf over the axes (:func:`jax_blink.ops.axes.typed`),
3. groups leaves that can travel together (dtype, weak type, varying axes,
   typing mode), packs each group's blocks into one vector (shard by shard;
   an allreduce's in one process passes them as separate operands instead,
   :mod:`jax_blink.ops.segmented`),
4. asks :func:`~jax_blink.choice.decide.decide` what each group does and records
   it for :func:`jax_blink.explain`, and
5. binds the primitive (per ``axis_index_groups`` group topology, a
   ``lax.switch`` when the groups' schedules differ) or runs the lax
   equivalent, and unpacks the blocks.
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_blink import settings
from jax_blink.choice import decide as _decide
from jax_blink.choice import log
from jax_blink.choice import requests
from jax_blink.ops import segmented as _segmented
from jax_blink.ops.axes import axis_size, canonical_groups, rank_and_group, typed
from jax_blink.ops.primitive import bind_collective
from jax_blink.processes.layout import HostLocal, layout
from jax_blink.topo import Topology

__all__ = ["run", "carried_as"]

_SHARDED_OUT = ("allgather",)

# dtypes carried in a wider schedule dtype with the same results: sums wrap
# modulo 2^k after the cast back, max/min and copies are exact
_WIDEN = {"bool": "int32", "int8": "int32", "int16": "int32", "uint8": "int32", "uint16": "int32"}


def carried_as(dtype) -> tuple:
    """``(schedule dtype, parts per element)`` a value of ``dtype`` travels as:
    complex as two floats, bool and the small integers widened."""
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(dtype.char.lower()).name, 2
    return _WIDEN.get(dtype.name, dtype.name), 1


def _prepare(block, name, collective, op):
    """``(parts, restore)``: the schedule-dtype blocks a leaf travels as, and
    how to rebuild the leaf's result from theirs."""
    dtype = np.dtype(block.dtype)
    if dtype.kind == "c":
        if op != "sum":
            raise TypeError(f"jax_blink.{name} does not support complex values ({dtype}); "
                            "neither does lax")
        return [jnp.real(block), jnp.imag(block)], lambda re, im: lax.complex(re, im)
    if dtype.name in _WIDEN:
        wide = _WIDEN[dtype.name]
        # a sum of bools is an int32 sum, as in lax; the others keep their dtype
        sums = op == "sum" and collective in ("allreduce", "reduce_scatter")
        back = np.int32 if (dtype == np.bool_ and sums) else dtype
        return [block.astype(wide)], lambda r: r.astype(back)
    if dtype.name not in _decide.SUPPORTED_DTYPES:
        raise TypeError(
            f"jax_blink.{name} does not support dtype {dtype}; supported dtypes are "
            f"{', '.join(_decide.SUPPORTED_DTYPES)}, complex64/128 (as float pairs), bool and "
            f"the 8- and 16-bit integers. Use the lax collective for this value.")
    return [block], lambda r: r


def run(blocks: list, axes: tuple, *, name: str, collective: str, op: str = "sum",
        root: Optional[int] = None, axis_index_groups=None, topology=None, min_bytes=None,
        timeout_s=None, chunks=None, fallback: Callable, unreduced_op: Optional[str] = None,
        invariant: bool = False, slow_ranks=None) -> list:
    """Runs ``collective`` over ``axes`` on 2-D ``blocks``; returns their results.

    ``fallback(blocks, mode)`` runs the lax equivalent on a list of
    schedule-dtype blocks (used where the decision is lax). ``invariant``
    (allgather): type a varying value's result invariant over the axes. ``slow_ranks``
    (allreduce, without ``axis_index_groups``): ranks of the axes the plan makes leaves.
    ``unreduced_op``: how the collective reduces a value typed unreduced over
    the axes ("sum"; "max" or "min" where jax types such values), None where it
    takes none (:func:`~jax_blink.ops.axes.typed`).
    A call whose groups span processes of one host runs over shared memory
    (:class:`~jax_blink.processes.layout.HostLocal`); one whose groups span
    hosts runs its lax equivalent (psum's hierarchical path,
    :mod:`~jax_blink.ops.hierarchical`, calls this per process).
    """
    if not blocks:
        return []
    nranks_axis = axis_size(axes, name)
    # lax allows groups of different sizes for the allreduces only
    groups = canonical_groups(axis_index_groups, nranks_axis, name,
                              equal_sizes=collective != "allreduce")
    if slow_ranks is not None and groups is not None:
        raise ValueError(f"jax_blink.{name}: slow_ranks cannot be combined with axis_index_groups (each "
                         "group is planned on its own); pass one or the other")
    sizes = [len(g) for g in groups] if groups else [nranks_axis]
    nranks = sizes[0]
    timeout_ms = settings.timeout_ms(timeout_s)

    parts, restores, owners = [], [], []
    for i, block in enumerate(blocks):
        ps, restore = _prepare(jnp.asarray(block), name, collective, op)
        restores.append((restore, len(ps)))
        for p in ps:
            parts.append(p)
            owners.append(i)

    reason = _decide.environment_reason(axes)
    transport, host_note, processes = 0, "", 1
    if reason is None:
        span = layout(axes, groups)
        if isinstance(span, HostLocal):
            transport, processes = 1, span.nprocesses  # the ranks meet in shared memory
            if topology is None and span.ranks_process is not None:
                topology = requests.topology_for(None, nranks_axis, span.ranks_process)
            host_note = (" (one schedule over the shared memory of this host's processes: "
                         f"{span.describe()})")
        elif span is not None:
            reason = (span if isinstance(span, str) else
                      f"the devices span processes ({span.describe()}); the hierarchical path "
                      "serves psum, pmean, pmax, pmin, psum_scatter and all_gather")
    if reason is not None:
        log.record(f"{name} over {axes}: {_decide.lax_equivalent(collective, op)} ({reason})")
        results = _lax(fallback, parts, "untyped", groups, name, collective, op, reason)
        return _restore(results, restores)

    modes = []
    for i, p in enumerate(parts):
        parts[i], mode = typed(p, axes, name, unreduced_op=unreduced_op)
        if mode == "varying" and invariant:
            mode = "invariant"
        modes.append("untyped" if groups and mode == "varying" else mode)

    by_key = collections.defaultdict(list)
    for i, p in enumerate(parts):
        aval = jax.typeof(p)  # weak-typed leaves stay apart so that they stay weak, as in lax
        by_key[(p.dtype, aval.weak_type, aval.manual_axis_type.varying, modes[i])].append(i)

    out = list(parts)
    rank = group = None
    shards_out = nranks if collective in _SHARDED_OUT else 1
    for (dtype, _, _, mode), idx in by_key.items():
        count = sum(int(np.prod(parts[i].shape)) for i in idx) * (nranks if shards_out > 1 else 1)
        topologies = _group_topologies(topology, nranks_axis, groups)
        def decide(threshold):
            return [_decide.decide(count, np.dtype(dtype).name, size, collective=collective, op=op,
                                   root=root, topology=t, min_bytes=threshold, chunks=chunks,
                                   processes=processes, slow_ranks=slow_ranks)
                    for t, size in zip(topologies, sizes)]

        decisions = decide(min_bytes)
        note = ""
        if groups is not None and jax.config.check_vma and not all(d.uses_blink for d in decisions):
            # lax takes no axis_index_groups under check_vma=True: where only min_bytes sent
            # the call to lax, run the planned collective instead
            retry = decide(0)
            if all(d.uses_blink for d in retry):
                decisions = retry
                note = (" (min_bytes ignored: lax takes no axis_index_groups under "
                        "shard_map(check_vma=True))")
        segmented = (all(d.uses_blink for d in decisions)
                     and _segmented.applies(collective, [parts[i] for i in idx], groups))
        if segmented:
            note += f" ({len(idx)} leaves as separate operands of one call)"
        for text in dict.fromkeys(d.text for d in decisions):
            log.record(f"{name} over {axes}{_groups_text(groups)}: {text}{note}{host_note}")
        if not all(d.uses_blink for d in decisions):
            why = next(d.text for d in decisions if not d.uses_blink)
            for i, r in zip(idx, _lax(fallback, [parts[i] for i in idx], mode, groups, name,
                                      collective, op, why)):
                out[i] = r
            continue
        if rank is None:
            rank, group = rank_and_group(axes, groups)
        if segmented:  # the bucket's leaves stay where they are: one call, no concatenation
            sums = _segmented.bind_segments([parts[i].reshape(-1) for i in idx], rank, group, axes=axes,
                                            request=decisions[0].request, schedule=decisions[0].schedule,
                                            timeout_ms=timeout_ms, mode=mode, transport=transport)
            for i, r in zip(idx, sums):
                out[i] = r.reshape(parts[i].shape)
            continue
        widths = [parts[i].shape[1] for i in idx]
        flat = (parts[idx[0]].reshape(-1) if len(idx) == 1
                else jnp.concatenate([parts[i] for i in idx], axis=1).reshape(-1))
        result = _bind(flat, rank, group, axes, decisions, groups, timeout_ms, mode, transport)
        result = result.reshape(shards_out, -1)
        offset = 0
        for i, w in zip(idx, widths):
            out[i] = result[:, offset:offset + w]
            offset += w
    return _restore(out, restores)


def _lax(fallback, parts, mode, groups, name, collective, op, why):
    """``fallback(parts, mode)``: the lax equivalent; jax's empty NotImplementedError for
    axis_index_groups under check_vma=True becomes one that says what to do."""
    try:
        return fallback(parts, mode)
    except NotImplementedError as e:
        if groups is None or str(e):
            raise
        raise NotImplementedError(
            f"jax_blink.{name} with axis_index_groups runs {_decide.lax_equivalent(collective, op)} "
            f"here ({why}), and jax's lax collectives take no axis_index_groups inside "
            "shard_map(check_vma=True); use shard_map(..., check_vma=False) or jax.pmap") from None


def _restore(results, restores):
    out, k = [], 0
    for restore, nparts in restores:
        out.append(restore(*results[k:k + nparts]))
        k += nparts
    return out


def _group_topologies(topology, nranks_axis, groups):
    """One topology per ``axis_index_groups`` group (each a partial
    allocation of the axis' topology), or ``[topology]`` without groups."""
    if groups is None:
        return [topology]
    if isinstance(topology, str):
        topology = Topology.preset(topology)
    if topology is None:
        topology = requests.topology_for(None, nranks_axis)
    if len({len(g) for g in groups}) == 1 and topology.n == len(groups[0]):
        return [topology] * len(groups)
    requests.topology_for(topology, nranks_axis)  # checks the rank count
    return [topology.subset(list(g), name=f"{topology.name}{list(g)}") for g in groups]


def _groups_text(groups):
    return "" if groups is None else f" in groups {[list(g) for g in groups]}"


def _bind(flat, rank, group, axes, decisions, groups, timeout_ms, mode, transport):
    def call(d):
        return lambda v: bind_collective(v, rank, group, axes=axes, request=d.request,
                                         schedule=d.schedule, timeout_ms=timeout_ms, mode=mode,
                                         transport=transport)

    distinct = list(dict.fromkeys(d.schedule for d in decisions))
    if len(distinct) == 1:
        return call(decisions[0])(flat)
    # the groups' allocations differ: each group runs its own schedule (a
    # separate call site, so a separate op id)
    branch_of = np.asarray([distinct.index(d.schedule) for d in decisions], np.int32)
    first = {s: next(d for d in decisions if d.schedule == s) for s in distinct}
    which = group % len(groups)  # rank_and_group: the other axes' index * len(groups) + group
    return lax.switch(jnp.asarray(branch_of)[which], [call(first[s]) for s in distinct], flat)
