"""Calibration: measure what the collectives cost on this machine, by jax_blink's executor and
by lax, and keep it as the machine's profile (``python -m jax_blink calibrate``).

:func:`measure_collective` times an allreduce, a reduce-scatter or an all-gather; per size it
also records the spread of the paired differences (:func:`paired_spread`), which the choices
respect (:func:`jax_blink.choice.decide.decide`: within the spread the plan runs).

:func:`measure_allreduce` times, per size, jitted programs one call at a time with a sync
after each, interleaved (so each time is one call's latency): ``none`` (``x * 2``, the
program without a collective), ``blink`` (``jax_blink.psum`` forced onto the plan), ``lax``
(``lax.psum``) and, for benchmarks, ``auto`` (``jax_blink.psum`` as users call it). What a
collective adds to a program is the median, over the rounds, of its call's time minus the
collective-free call's next to it (paired, so that the machine's drift cancels): the quantity
psum's choice and the bucket size compare (:mod:`jax_blink.choice.predict_cpu`). ``benchmarks/bench_cpu.py psum``
measures with the same function.

:func:`calibrate` measures the devices of this process (one layout, ``1xN``: the allreduce,
and on CPU devices the reduce-scatter and all-gather at :data:`COLLECTIVE_ELEMENTS`) and writes the
profile (:mod:`jax_blink.planning.profile`, keyed by :func:`jax_blink.choice.machine.machine_key`)
atomically into the cache directory. A full calibration measures 6 sizes (1 to 1e6 float32
per device, about a minute on 8 CPU devices of a 2-core VM, training steps included); ``quick``
4 sizes with fewer calls (about 8 s). A full calibration also times the training steps of
:data:`STEP_MODELS` (:func:`measure_steps`): what summing their gradient pytrees adds to a
step, by lax and by jax_blink in buckets of each size of :data:`BUCKET_CANDIDATES`, the
profile's ``steps`` and ``buckets``: psum's default bucket size for a pytree is the one
measured best on the model nearest it in bytes. Every collective is bounded by psum's
timeout, so it never hangs.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_blink import numerics, settings
from jax_blink.ops import buckets as _buckets
from jax_blink.choice import machine
from jax_blink.measure.rounds import interleaved, paired, paired_spread, print_result, read_result
from jax_blink.measure.timing import bucketed, run_steps, wrong_gradient_sums
from jax_blink.ops.psum import psum
from jax_blink.ops.scatter_gather import all_gather, psum_scatter
from jax_blink.planning import profile as profiles

__all__ = ["VARIANTS", "FULL_ELEMENTS", "QUICK_ELEMENTS", "STEP_MODELS", "BUCKET_CANDIDATES",
           "COLLECTIVE_ELEMENTS", "GROUPS", "paired_spread", "measure_collective", "measure_allreduce", "measure_steps",
           "calibrate"]

logger = logging.getLogger("jax_blink")

#: The programs :func:`measure_allreduce` can time (see the module docstring).
VARIANTS = ("none", "blink", "lax", "auto")
#: Float32 elements per device a full calibration measures, and a quick one. (Not 1e7: it
#: took 8 of a full calibration's 70 s, and on every recorded profile it decided as 1e6 did,
#: which the model extrapolates linearly: benchmarks/results/profile_intel-xeon-2core.json.)
FULL_ELEMENTS = (1, 100, 1_000, 10_000, 100_000, 1_000_000)
QUICK_ELEMENTS = (1, 1_000, 100_000, 1_000_000)
#: Float32 elements of each device's input at which a calibration times the reduce-scatter
#: and the all-gather (fewer sizes than the allreduce's, so that a full calibration stays
#: within a minute; an all-gather's output is the devices' count times its input); over
#: groups of :data:`GROUPS`, and in a quick calibration, the first and last of each.
COLLECTIVE_ELEMENTS = {"reduce_scatter": (1_000, 100_000, 1_000_000), "allgather": (1_000, 10_000, 100_000)}
#: Besides all of the process's devices, the group sizes over which a calibration times the
#: reduce-scatter and all-gather (all groups at once): a mesh axis of 2 or 4 devices (tensor
#: parallel, FSDP on a 2-D mesh) costs lax far less than one over 8 does.
GROUPS = (2, 4)
#: The MLPs (depth, width: gradients of 1, 4 and 33.6 MB per device) whose training steps a
#: full calibration times, batch 64 per device; the largest that large because only there did
#: buckets beat one bucket (docs/design_notes.md, "A bucket's leaves as separate operands").
STEP_MODELS = ((4, 256), (4, 512), (8, 1024))
#: The bucket sizes (bytes per device) a full calibration times those steps in: a quarter,
#: one and four MiB, and one bucket for the whole pytree.
BUCKET_CANDIDATES = (1 << 18, 1 << 20, 1 << 22, settings.MAX_BUCKET_BYTES)
#: The least time a collective is taken to add (microseconds): a median below the
#: collective-free program's is noise, and a profile's times must be positive.
MIN_ADDED_US = 1.0
#: Cores other processes may keep busy while a calibration measures before its profile is
#: only provisional: one busy process beside it moved a 2-core VM's choices (docs/performance.md,
#: "Calibration").
BUSY_CORES = 0.5
#: The fewest rounds a size's first pass may stop at: below 6, the sign test's 95% interval
#: (:func:`paired_spread`) always holds zero.
MIN_EARLY_ROUNDS = 7


@contextlib.contextmanager
def _algo(value: str):
    """``JAX_BLINK_ALGO=value`` while a program is traced (psum reads it at trace time)."""
    old = os.environ.get("JAX_BLINK_ALGO")
    os.environ["JAX_BLINK_ALGO"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("JAX_BLINK_ALGO", None)
        else:
            os.environ["JAX_BLINK_ALGO"] = old


def _rounds(elements: int, rounds: int) -> int:
    """Calls per program at ``elements`` per device: small calls are cheap (a fraction of a
    millisecond) and their differences small beside the program's jitter, so they get many
    rounds (the fixed cost they measure decides the bucket size, and a spread narrow
    enough to tell tens of microseconds apart decides the choice); large ones are slow and
    steady."""
    if elements <= 10_000:
        return 9 * rounds
    if elements <= 100_000:
        return 3 * rounds
    return rounds if elements <= 1_000_000 else max(5, rounds // 4)


#: The collectives :func:`measure_collective` times: jax_blink's drop-in and lax's, each
#: as ``f(row, axis)`` on a device's ``(1, elements)`` float32 row, its input.
_OPS = {"allreduce": (lambda v, a: psum(v, a), lambda v, a: lax.psum(v, a)),
        "reduce_scatter": (lambda v, a: psum_scatter(v[0], a, tiled=True)[None],
                           lambda v, a: lax.psum_scatter(v[0], a, tiled=True)[None]),
        "allgather": (lambda v, a: all_gather(v[0], a, tiled=True)[None],
                      lambda v, a: lax.all_gather(v[0], a, tiled=True)[None])}


def _wrong(collective: str, got: np.ndarray, rows, inputs: np.ndarray, group: int) -> int:
    """Elements of the devices' results ``got`` (stacked; those of global rows ``rows``) of
    ``collective`` over the devices' ``inputs`` (stacked) in groups of ``group`` consecutive
    rows, outside the summation-order bound (:func:`jax_blink.numerics.wrong_elements`; an
    all-gather must equal its inputs)."""
    wrong = 0
    if collective == "allreduce":  # a group's results share one exact sum and bound: computed once
        rows = np.asarray(rows)
        for first in sorted(set((rows // group * group).tolist())):
            mine = rows // group * group == first
            wrong += numerics.wrong_elements(got[mine], inputs[first:first + group])
        return wrong
    for g, r in zip(got, rows):
        members = inputs[r // group * group:(r // group + 1) * group]
        if collective == "reduce_scatter":
            wrong += numerics.wrong_elements(g, members.reshape(group, group, -1)[:, r % group])
        else:
            wrong += numerics.wrong_elements(g, members.reshape(1, -1))
    return wrong


def _agreed(mine: bool) -> bool:
    """Process 0's ``mine``, on every process of the job (each times its own calls, and all
    must make the same)."""
    if jax.process_count() == 1:
        return mine
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(mine)))


def measure_collective(collective: str, elements: Sequence[int], rounds: int = 21,
                       variants: Sequence[str] = ("none", "blink", "lax"),
                       progress: Optional[Callable[[int, int, str], None]] = None,
                       group: Optional[int] = None) -> list:
    """Per size (float32 elements of each device's input), the median time of one call of
    each program in ``variants`` over every device of this process, and what each collective
    adds to ``none`` (``<variant>_added_us``; needs ``"none"``), with ``wrong``: elements of
    the plan's result outside the summation-order bound (:mod:`jax_blink.numerics`) and, with
    ``blink`` and ``lax``, ``spread_us``: how far their paired difference could lie toward
    zero by noise (:func:`paired_spread`). Where that interval holds zero, the size is
    measured once more and the rounds pooled (in a job of one process). ``group``: the
    collective over groups of that many devices, all groups at once (as a mesh axis of that
    size runs it); None: over every device. ``collective``: ``"allreduce"``,
    ``"reduce_scatter"`` (sizes rounded up to a multiple of the devices) or ``"allgather"``.
    ``progress(done, total, what)`` is called after each size."""
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; use some of {VARIANTS}")
    if collective not in _OPS:
        raise ValueError(f"unknown collective {collective!r}; use one of {', '.join(_OPS)}")
    n = jax.device_count()
    if n < 2:
        raise ValueError(f"measuring a collective needs at least 2 devices, the job has {n}")
    group = n if group is None else group
    if not 2 <= group <= n or n % group:
        raise ValueError(f"group must divide the {n} devices and be at least 2, got {group}")
    mesh = jax.make_mesh((n // group, group), ("rest", "x"))
    spec = P(("rest", "x"))  # global row i: group i // group, rank i % group
    sharding = NamedSharding(mesh, spec)

    def shard(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))

    # (the collective's input is a value the program computes, as a gradient is: XLA would
    # copy a parameter before jax_blink's in-place allreduce)
    ours, theirs = _OPS[collective]
    bodies = {"none": lambda v: v * 2, "blink": lambda v: ours(v * 2, "x"),
              "lax": lambda v: theirs(v * 2, "x"), "auto": lambda v: ours(v * 2, "x")}
    rows = []
    for i, count in enumerate(elements):
        count = -(-int(count) // group) * group if collective == "reduce_scatter" else int(count)
        programs = {k: shard(bodies[k]) for k in variants}
        x = np.random.default_rng(0).random((n, count), dtype=np.float32)  # (uniform: 4x faster to draw)
        x -= 0.5
        # every process holds its own devices' rows (one process: all of them)
        xs = jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
        for k, f in programs.items():  # trace, compile and run once
            with _algo("blink") if k == "blink" else contextlib.nullcontext():
                got = jax.block_until_ready(f(xs))
            if k == "blink":
                mine = np.stack([np.asarray(s.data).reshape(-1) for s in got.addressable_shards])
                rows_of = [s.index[0].start or 0 for s in got.addressable_shards]
                wrong = _wrong(collective, mine, rows_of, 2 * x, group)
        times = {k: [] for k in programs}

        calls = {k: functools.partial(lambda f: jax.block_until_ready(f(xs)), f) for k, f in programs.items()}

        def measure(n):
            interleaved(calls, n, times)

        def spread():
            d = paired(times, "blink", "lax") * 1e6
            return paired_spread(d), abs(float(np.median(d)))

        # A third of the rounds first: where they already tell the two apart by twice their
        # spread, the rest would only confirm it. Where all of them cannot tell, once more,
        # pooled. (Every process of a job must make the same calls: process 0's rounds decide.)
        planned = _rounds(count, rounds)
        adaptive = {"blink", "lax"} <= set(programs)
        first = planned // 3 if adaptive and planned // 3 >= MIN_EARLY_ROUNDS else planned
        measure(first)
        if first < planned and not _agreed(2 * spread()[0] < spread()[1]):
            measure(planned - first)
        if adaptive and _agreed(spread()[0] >= spread()[1]):
            measure(planned)
        med = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
        row = {"count": count, "size_bytes": count * 4, **{f"{k}_us": v for k, v in med.items()}}
        if "none" in med:  # paired: each round's call minus the collective-free call next to it
            none = np.asarray(times["none"])
            row.update({f"{k}_added_us": max(float(np.median(np.asarray(v) - none)) * 1e6, MIN_ADDED_US)
                        for k, v in times.items() if k != "none"})
        if {"blink", "lax"} <= set(programs):
            row["spread_us"] = spread()[0]
        if "blink" in programs:
            row["wrong"] = wrong
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(elements), f"{count:g} float32 per device")
    return rows


def measure_allreduce(elements: Sequence[int], rounds: int = 21, variants: Sequence[str] = ("none", "blink", "lax"),
                      progress: Optional[Callable[[int, int, str], None]] = None) -> list:
    """:func:`measure_collective` of the allreduce (sizes: float32 elements per device)."""
    return measure_collective("allreduce", elements, rounds, variants, progress)


def _leaf_bytes(depth: int, width: int) -> list:
    """The bytes per device of an MLP's gradient leaves, in pytree order (float32 weights, biases)."""
    return [width * width * 4, width * 4] * depth


def _step_rounds(nbytes: int, rounds: int) -> tuple:
    """``(rounds, reps)`` of a model's steps with ``nbytes`` of gradients per device: the large
    models' steps take half a second, far beyond the timer's jitter that repeated steps
    average out, and their buckets' differences are large."""
    return (rounds, 3) if nbytes <= 1 << 24 else (max(3, rounds // 2), 1)


def measure_steps(models: Sequence = STEP_MODELS, rounds: int = 7,
                  candidates: Sequence[int] = BUCKET_CANDIDATES) -> tuple:
    """What summing the gradient pytree of each MLP of ``models`` (``(depth, width)``) adds to
    its jitted data-parallel training step (:func:`jax_blink.measure.timing.run_steps`, the
    variants interleaved), by ``lax.psum`` and by ``jax_blink.psum`` on the plan in buckets of
    each size of ``candidates`` (bytes per device; sizes that bucket a model's leaves alike
    are timed once), in microseconds.

    Returns ``(steps, buckets)``: the profile's ``steps`` table of this process's devices (by
    the pytree's bytes per device; jax_blink in the buckets psum then takes for it) and its
    ``buckets`` table (per model and candidate, jax_blink's added time over lax's).
    RuntimeError where a summed gradient is wrong."""
    added = {}  # (depth, width) -> {"lax": us, candidate: us}
    for depth, width in models:
        split = {c: tuple(map(tuple, _buckets.split(_leaf_bytes(depth, width), c))) for c in candidates}
        timed = {s: c for c, s in reversed(list(split.items()))}  # one candidate per bucketing
        with _algo("blink"):
            n, reps = _step_rounds(sum(_leaf_bytes(depth, width)), rounds)
            rows, _ = run_steps([(depth, width)], rounds=n, reps=reps,
                                variants=("none", "lax.psum", *(bucketed(c) for c in timed.values())), check=())
        step = {r["variant"]: r["step_ms"] * 1e3 for r in rows}
        def more(variant):
            return max(step[variant] - step["none"], MIN_ADDED_US)
        added[depth, width] = {"lax": more("lax.psum"),
                               **{c: more(bucketed(timed[split[c]])) for c in candidates}}
    order = sorted(added, key=lambda m: sum(_leaf_bytes(*m)))
    nbytes = [sum(_leaf_bytes(*m)) for m in order]
    buckets = {"bytes": nbytes, "bucket_bytes": list(candidates),
               "vs_lax": [[added[m][c] / added[m]["lax"] for c in candidates] for m in order]}
    kept = {m: profiles.best_bucket(buckets, b) for m, b in zip(order, nbytes)}
    for (depth, width), c in kept.items():  # the bucketing psum will run: its sums must be right
        with _algo("blink"):
            wrong = wrong_gradient_sums(depth, width, bucketed(c))
        if wrong:
            raise RuntimeError(f"jax_blink calibrate: {wrong} gradient elements of the {depth}x{width} MLP summed "
                               f"in buckets of {c} bytes were wrong; nothing was written (report this)")
    steps = {"bytes": nbytes, "blink": [added[m][kept[m]] for m in order], "lax": [added[m]["lax"] for m in order]}
    return steps, buckets


def _bar(out=sys.stderr):
    """A one-line progress bar on ``out`` (redrawn in place on a terminal, a line per step
    otherwise)."""
    start = time.monotonic()
    tty = out.isatty()

    def show(done, total, what):
        filled = int(20 * done / total)
        text = (f"calibrating [{'#' * filled}{'.' * (20 - filled)}] {done}/{total} {what}, "
                f"{time.monotonic() - start:.0f} s")
        print(("\r" + text) if tty else text, end="" if tty and done < total else "\n", file=out, flush=True)

    return show


#: Processes of one host a full calibration measures (one CPU device each, as
#: :data:`jax_blink.planning.cost.CPU_HOST_ALLREDUCE_US` was), and the sizes.
HOST_PROCESSES = 2
HOST_ELEMENTS = (1, 1_000, 100_000, 1_000_000)
#: Processes measured as separate hosts (JAX_BLINK_HOST_KEY), of 2 CPU devices each so that
#: each host's phase has devices to plan over, and the sizes: Blink's phases (the allreduce's
#: win at every size, so only the reduce-scatter and all-gather are measured) against lax,
#: on both sides of where :data:`jax_blink.planning.cost.CPU_CROSS_PROCESS_BYTES` puts their
#: crossings (4 MB and 1 MB per device).
SPANNING_DEVICES = 2
SPANNING_ELEMENTS = {"reduce_scatter": (10_000, 1_000_000), "allgather": (10_000, 100_000, 1_000_000)}
#: How long a processes' job may take before it is stopped (seconds).
HOST_TIMEOUT_S = 180.0


def _measure_processes(processes: int, sizes: dict, rounds: int, devices: int = 1, hosts: bool = False) -> dict:
    """``{collective: rows}``: :func:`measure_collective` of each collective of ``sizes`` at
    its sizes, in a local job of ``processes`` processes of ``devices`` CPU devices each
    (:func:`jax_blink.launch.run_local`: 127.0.0.1, gloo for lax; jax_blink over the host's
    shared memory, or with ``hosts`` each process labelled a host of its own, so that
    jax_blink runs its phases across hosts); RuntimeError naming what failed."""
    import json

    from jax_blink.launch import run_local

    spec = json.dumps({"rounds": rounds, "hosts": hosts, "sizes": {c: list(v) for c, v in sizes.items()}})
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    results = run_local([sys.executable, "-m", "jax_blink.measure.calibration", spec], processes,
                        devices_per_process=devices, timeout_s=HOST_TIMEOUT_S, env=env)
    value = read_result(results[0].stdout)
    if value is None or not all(r.ok for r in results):
        why = "; ".join(f"process {r.process_id}: " + ("killed at the time limit" if r.returncode is None
                                                       else f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
                        for r in results if not r.ok) or "process 0 printed no result"
        kind = "hosts" if hosts else "one host"
        raise RuntimeError(f"measuring {processes} processes of {kind} failed ({why})")
    return value


def _table(rows) -> dict:
    return {"elements": [r["count"] for r in rows], "blink": [r["blink_added_us"] for r in rows],
            "lax": [r["lax_added_us"] for r in rows]} | (
                {"spread": [r["spread_us"] for r in rows]} if all("spread_us" in r for r in rows) else {})


def _groups(n: int) -> list:
    """The group sizes a calibration of ``n`` devices measures: :data:`GROUPS` that divide
    ``n``, and ``n``."""
    return sorted({g for g in GROUPS if g < n and n % g == 0} | {n})


def others_cpu(seconds: float = 0.25) -> float:
    """Cores that processes other than this one kept busy over the next ``seconds`` (Linux's
    ``/proc/stat`` less this process's own CPU time); elsewhere the 1-minute load average,
    which also counts this process's own recent work."""
    def busy_jiffies():
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # less idle and iowait

    try:
        before, own, wall = busy_jiffies(), _own_cpu(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]
    time.sleep(seconds)
    elapsed = time.monotonic() - wall
    total = (busy_jiffies() - before) / os.sysconf("SC_CLK_TCK")
    return max(total - (_own_cpu() - own), 0.0) / elapsed


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _check_writable(target: Path) -> None:
    """OSError naming ``target`` and what to do, where a profile cannot be written there."""
    try:
        if target.is_dir():
            raise IsADirectoryError(21, "it is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".calibrate-"):
            pass
    except OSError as e:
        raise OSError(f"cannot write the profile to {target}: {e.strerror or e}; give a writable file "
                      "(--out FILE, or calibrate(path=...)) or set JAX_BLINK_CACHE_DIR") from None


def calibrate(quick: bool = False, path=None, rounds: Optional[int] = None, progress: bool = True):
    """Measures this process's devices and, unless ``quick``, :data:`HOST_PROCESSES`
    processes of one host and the training steps of :data:`STEP_MODELS` (CPU devices only:
    the host transport is a CPU executor's, and on GPUs a pytree is one bucket), and writes
    their profile; returns ``(profile, path)``. On GPUs the plan runs tuned for the CUDA
    executor and lax is NCCL: psum's GPU choice then reads them
    (:func:`jax_blink.choice.predict_gpu.measured_allreduce`).

    ``path``: where to write it (default: this machine's place in the cache directory,
    where psum looks); ``rounds``: calls per program and size (default 21, quick 7).
    Where the processes' job fails, the profile keeps the in-process layout alone, with a
    warning saying why.
    """
    if jax.process_count() > 1:
        raise ValueError("calibrate measures the devices of one process: run `python -m jax_blink calibrate` "
                         "alone, not inside a multi-process job")
    target = Path(path) if path is not None else machine.profile_path()
    _check_writable(target)  # before a minute of measuring
    start = time.monotonic()
    cores = os.cpu_count() or 1

    def check_busy() -> bool:
        others = others_cpu()
        if others > BUSY_CORES:
            logger.warning("jax_blink calibrate: this machine is busy (other processes use %.1f of its %d cores): "
                           "the measurements will be noisy and may choose wrong; the profile is saved as "
                           "provisional (the next calibration replaces it): calibrate on an idle machine",
                           others, cores)
        return others > BUSY_CORES

    busy = check_busy()
    elements = QUICK_ELEMENTS if quick else FULL_ELEMENTS
    rounds = rounds or (7 if quick else 21)
    bar = _bar() if progress else None
    cpu = jax.devices()[0].platform == "cpu"
    full = not quick and cpu
    others = profiles.COLLECTIVES if cpu else ()
    n = jax.device_count()
    # (a quick calibration, the first run's, measures the other collectives over all devices alone)
    groups = ([n] if quick else _groups(n)) if others else []
    steps = len(elements) + len(others) * len(groups) + (3 if full else 0)
    rows = measure_allreduce(elements, rounds, ("none", "blink", "lax"),
                             None if bar is None else lambda done, _, what: bar(done, steps, what))
    tables = {f"1x{n}": rows}
    other_layouts = {f"1x{g}": {} for g in groups}  # layout -> {collective: rows}
    done = len(elements)
    for g in groups:  # (on GPUs the choice of these reads the simulator and NCCL's model)
        for c in others:
            sizes = COLLECTIVE_ELEMENTS[c]
            if quick or g < n:
                sizes = (sizes[0], sizes[-1])
            other_layouts[f"1x{g}"][c] = measure_collective(c, sizes, rounds, group=g)
            done += 1
            if bar is not None:
                bar(done, steps, f"{c.replace('_', '-')} over {g} devices")
    step_tables = bucket_tables = {}
    if full:
        try:
            job = _measure_processes(HOST_PROCESSES, {"allreduce": HOST_ELEMENTS, **{
                c: COLLECTIVE_ELEMENTS[c] for c in others}}, max(5, rounds // 2))
            tables[f"{HOST_PROCESSES}x1"] = job.pop("allreduce")
            other_layouts[f"{HOST_PROCESSES}x1"] = job
        except RuntimeError as e:
            logger.warning("jax_blink calibrate: %s; the profile keeps one process's layout", e)
        if bar is not None:
            bar(steps - 2, steps, f"{HOST_PROCESSES} processes of one host")
        try:
            other_layouts[f"{HOST_PROCESSES}x{SPANNING_DEVICES}{profiles.HOSTS}"] = _measure_processes(
                HOST_PROCESSES, SPANNING_ELEMENTS, max(5, rounds // 2), SPANNING_DEVICES, hosts=True)
        except RuntimeError as e:
            logger.warning("jax_blink calibrate: %s; devices spanning hosts keep the recorded range", e)
        if bar is not None:
            bar(steps - 1, steps, f"{HOST_PROCESSES} processes as hosts")
        step_tables, bucket_tables = (
            {f"1x{jax.device_count()}": t} for t in measure_steps(STEP_MODELS, max(5, rounds // 4)))
        if bar is not None:
            bar(steps, steps, "training steps")
    busy = check_busy() or busy  # a job that started while this one measured
    measured = [*tables.values(), *(t for layout in other_layouts.values() for t in layout.values())]
    wrong = sum(r["wrong"] for t in measured for r in t)
    if wrong:
        raise RuntimeError(f"jax_blink calibrate: the plan gave {wrong} wrong elements; "
                           f"nothing was written (report this: {tables}, {other_layouts})")
    made = profiles.Profile(key=machine.machine_key(), tables={k: _table(t) for k, t in tables.items()}, quick=quick,
                            seconds=round(time.monotonic() - start, 2),
                            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            steps=step_tables, buckets=bucket_tables,
                            collectives={k: {c: _table(t) for c, t in ts.items()}
                                         for k, ts in other_layouts.items() if ts}, provisional=busy)
    where = profiles.save(made, target)
    machine.forget()
    return made, where


def _size_name(size: int) -> str:
    """A bucket size as ``calibrate`` prints it: ``1 MiB``, ``256 KiB``, ``one bucket``."""
    if size >= settings.MAX_BUCKET_BYTES:
        return "one bucket"
    return f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size >> 10} KiB" if size % 1024 == 0 else f"{size} B"


def describe(p: profiles.Profile) -> str:
    """One line per layout and size: both times and which is faster."""
    lines = []
    def verdict(b, x, spread):
        if spread is not None and abs(b - x) <= spread:
            return f"cannot tell (spread {spread:.1f} us)"
        return "jax_blink" if b < x else "lax"

    every = [("allreduce", layout, t) for layout, t in p.tables.items()] + [
        (c, layout, t) for layout, ts in p.collectives.items() for c, t in ts.items()]
    for collective, layout, t in every:
        spreads = t.get("spread", [None] * len(t["elements"]))
        for count, b, x, sp in zip(t["elements"], t["blink"], t["lax"], spreads):
            lines.append(f"  {layout:>9} {collective:>14} {count:>10g} float32/device: jax_blink {b:9.1f} us, "
                         f"lax {x:9.1f} us  -> {verdict(b, x, sp)}")
    for layout, t in p.steps.items():
        for nbytes, b, x in zip(t["bytes"], t["blink"], t["lax"]):
            lines.append(f"  {layout:>9} step, {nbytes / 1e6:5.2f} MB of gradients/device: jax_blink {b:9.1f} us, "
                         f"lax {x:9.1f} us  -> {'jax_blink' if b < x else 'lax'}")
    for layout, t in p.buckets.items():
        for nbytes, row in zip(t["bytes"], t["vs_lax"]):
            lines.append(f"  {layout:>9} step, {nbytes / 1e6:5.2f} MB in buckets of " + ", ".join(
                f"{_size_name(size)} {r:.2f}" for size, r in zip(t["bucket_bytes"], row))
                + f" of lax  -> {_size_name(p.bucket_bytes(layout, nbytes))}")
    return "\n".join(lines)


if __name__ == "__main__":  # a process of _measure_processes' job
    import json

    from jax_blink.launch import ENV, initialize

    job = json.loads(sys.argv[1])
    if job["hosts"]:  # before the transport groups the processes into hosts
        os.environ["JAX_BLINK_HOST_KEY"] = f"calibration-host-{os.environ[ENV['process_id']]}"
    first = initialize() == 0
    rows = {c: measure_collective(c, sizes, job["rounds"]) for c, sizes in job["sizes"].items()}
    if first:
        print_result(rows)
