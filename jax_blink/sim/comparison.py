"""Blink against the baselines: one topology at one size, or every allocation of a machine.

:func:`compare` simulates the Blink plan (lowered by :func:`~jax_blink.sim.tune`)
next to every baseline of :mod:`jax_blink.sim.baselines` and reports
nccl-tests' columns; :func:`sweep_subsets` does so on every allocation of
two or more ranks and summarises the speedups. The ``bench`` command and the
benchmarks print what these return.

Pure Python: never imports jax.
"""

from __future__ import annotations

import itertools
import math

from ..planning import plan
from .baselines import all_baselines
from .simulator import simulate
from ..planning.cost import CUDA_STREAM
from . import nccl as nccl_model
from .simulator import bus_factor
from .tuning import tune, tune_baseline

__all__ = ["compare", "sweep_subsets"]


def compare(topology, size_bytes: int, dtype="float32", model=None) -> dict:
    """Simulate Blink and every baseline on ``topology`` at ``size_bytes``.

    Returns
    -------
    dict
        ``{algorithm: row}``, Blink first then :data:`jax_blink.sim.baselines.BASELINES`;
        each row holds ``time_us``, ``algbw_gbps``, ``busbw_gbps``; Blink's also
        ``speedup`` (fastest baseline's time / Blink's), ``vs_ring`` (NCCL-style
        ring's time / Blink's), ``trees`` and ``chunks`` of the lowering used.
        Every algorithm is scored at its fastest chunking found by the same
        search (:func:`~jax_blink.sim.tune`, :func:`~jax_blink.sim.tune_baseline`);
        a baseline's row also gives ``time_us_model_chunks``, its time with the
        cost model's chunks alone. Where the topology names its GPU, a
        ``nccl-model`` row gives NCCL as its own tuner predicts it
        (:mod:`jax_blink.sim.nccl`, with its ``algorithm`` and ``protocol``),
        and Blink's row ``time_us_cuda_executor`` (its lowering tuned for the
        CUDA executor, :data:`jax_blink.planning.cost.CUDA_STREAM`: the
        transfer plus the executor's costs) and
        ``vs_nccl_model`` (NCCL's time over that): the comparison psum's choice
        makes on GPUs.
    """
    tuned = tune(plan(topology, "allreduce"), size_bytes, dtype, model=model)
    results, formula = {"blink": tuned.result}, {}
    for name, schedule in all_baselines(topology, size_bytes, dtype, model=model).items():
        formula[name] = simulate(schedule, topology, model=model)
        # the same search as Blink's: the baseline scored is its fastest chunking
        results[name] = min(tune_baseline(name, topology, size_bytes, dtype, model).result,
                            formula[name], key=lambda r: r.time_s)
    rows = {name: {"time_us": r.time_us, "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps}
            for name, r in results.items()}
    for name, r in formula.items():  # and with the cost model's chunks alone, side by side
        rows[name]["time_us_model_chunks"] = r.time_us
    best = min(r["time_us"] for name, r in rows.items() if name not in ("blink", "nccl-model"))
    rows["blink"].update(speedup=best / rows["blink"]["time_us"],
                         vs_ring=rows["nccl-ring"]["time_us"] / rows["blink"]["time_us"],
                         trees=tuned.num_trees, chunks=list(tuned.chunks))
    # the per-call view psum's decision takes on GPUs: Blink run by the CUDA executor (its
    # transfer plus the executor's costs) against NCCL as its own tuner predicts it
    nccl = nccl_model.predict(topology, size_bytes)
    if nccl is not None:  # Blink's lowering tuned for the CUDA executor, as psum's decision tunes it
        cuda_us = tune(plan(topology, "allreduce"), size_bytes, dtype, model=model,
                       executor=CUDA_STREAM).seconds * 1e6
        rows["nccl-model"] = {"time_us": nccl.seconds * 1e6, "algbw_gbps": size_bytes / nccl.seconds / 1e9,
                              "busbw_gbps": size_bytes / nccl.seconds / 1e9 * bus_factor("allreduce", topology.n),
                              "algorithm": nccl.algorithm, "protocol": nccl.protocol}
        rows["blink"].update(time_us_cuda_executor=cuda_us, vs_nccl_model=nccl.seconds * 1e6 / cuda_us)
    return rows


def _one_allocation(job):
    topology, ranks, sizes, dtype, model = job
    sub = topology.subset(ranks)
    return ranks, {size: compare(sub, size, dtype, model) for size in sizes}


def sweep_subsets(topology, sizes, dtype="float32", model=None, min_gpus=2, jobs=1, progress=None):
    """Blink against the baselines on every allocation of ``min_gpus`` or more ranks.

    Parameters
    ----------
    topology : Topology
    sizes : sequence of int
        Message sizes in bytes.
    dtype : str
    model : SimModel, optional
    min_gpus : int
        Smallest allocation (at least 2).
    jobs : int
        Worker processes (forked) for the allocations.
    progress : callable, optional
        ``progress(iterable, total=n)`` wraps the allocations as they finish,
        e.g. a ``tqdm`` progress bar.

    Returns
    -------
    (summary, rows)
        ``summary[size]``: allocations, geometric mean and max of Blink's
        speedup over the NCCL-style ring (``vs_ring``) and over the fastest
        baseline, how many allocations Blink is slower than some baseline
        (``slower``), and how many it is still slower after falling back to
        ``lax.psum`` -- NCCL, which picks the faster of its ring and double
        binary tree -- where the simulator predicts that to be faster
        (``slower_with_fallback``); on the CUDA executor against NCCL's own
        model, the geometric mean of NCCL's time over Blink's
        (``geomean_vs_nccl_model``) and how many allocations NCCL's model is
        faster in (``slower_than_nccl_model``: psum's choice takes NCCL there).
        ``rows``: per allocation and size, the rows of :func:`compare`.
    """
    if min_gpus < 2:
        raise ValueError(f"min_gpus must be >= 2, got {min_gpus}")
    allocations = [list(c) for k in range(min_gpus, topology.n + 1)
                   for c in itertools.combinations(range(topology.n), k)]
    work = [(topology, ranks, sizes, dtype, model) for ranks in allocations]
    track = progress or (lambda iterable, total: iterable)
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = list(track(pool.imap(_one_allocation, work), total=len(work)))
    else:
        results = list(track(map(_one_allocation, work), total=len(work)))
    summary = {}
    for size in sizes:
        vs_ring, vs_best, slower, slower_fb, worst = [], [], 0, 0, (-math.inf, None)
        vs_model = []
        for ranks, by_size in results:
            rows = by_size[size]
            blink = rows["blink"]
            vs_ring.append(blink["vs_ring"])
            vs_best.append(blink["speedup"])
            if "vs_nccl_model" in blink:
                vs_model.append(blink["vs_nccl_model"])
            if blink["speedup"] < 1:
                slower += 1
                nccl = min(rows["nccl-ring"]["time_us"], rows["nccl-dbtree"]["time_us"])
                best = min(r["time_us"] for name, r in rows.items() if name not in ("blink", "nccl-model"))
                if min(blink["time_us"], nccl) > best:
                    slower_fb += 1
            if blink["vs_ring"] > worst[0]:
                worst = (blink["vs_ring"], ranks)
        summary[size] = {
            "allocations": len(results),
            "geomean_vs_ring": math.exp(sum(math.log(x) for x in vs_ring) / len(vs_ring)),
            "max_vs_ring": max(vs_ring), "max_vs_ring_allocation": worst[1],
            "geomean_vs_best": math.exp(sum(math.log(x) for x in vs_best) / len(vs_best)),
            "min_vs_best": min(vs_best),
            "slower": slower, "slower_with_fallback": slower_fb,
            # Blink on the CUDA executor against NCCL's own model (where the GPU is known)
            "geomean_vs_nccl_model": (math.exp(sum(math.log(x) for x in vs_model) / len(vs_model))
                                      if vs_model else None),
            "slower_than_nccl_model": sum(1 for x in vs_model if x < 1),
        }
    rows = [{"ranks": ranks, "sizes": {str(size): r for size, r in by_size.items()}} for ranks, by_size in results]
    return summary, rows
