"""The simulator's cost parameters (:class:`SimModel`) and its error type.

Link latencies default to the one table of the cost model,
:data:`jax_blink.planning.cost.LATENCY_US`; a model may override any of them.
Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses

from ..planning.cost import LATENCY_US, latency_s

__all__ = ["SimModel", "SimError", "DEFAULT_REDUCE_GBPS"]

#: The reducer of a topology that does not say how fast its devices reduce:
#: a third of a V100's 900 GB/s of HBM.
DEFAULT_REDUCE_GBPS = 300.0


class SimError(ValueError):
    """The schedule cannot run on the topology, or the model is invalid."""


@dataclasses.dataclass(frozen=True)
class SimModel:
    """Cost parameters of the simulation (the model is described in :mod:`jax_blink.sim.simulator`).

    Attributes
    ----------
    latency_us : dict
        Latency (alpha) of one arc by link kind, in microseconds; a route
        through switches pays the sum over its arcs. Kinds missing here use
        the cost model's :data:`~jax_blink.planning.cost.LATENCY_US`.
    step_overhead_us : float
        Fixed cost of every step (kernel launch, flag polling, dispatch).
    reduce_gbps : float or None
        Reduction throughput of one rank in GB/s of chunk data (``inf``:
        free). None (the default): the topology's
        :attr:`~jax_blink.topo.Topology.reduce_gbps` (the presets set it per
        GPU: a third of its memory bandwidth, since a reduction reads two
        operands and writes one), else :data:`DEFAULT_REDUCE_GBPS`.
    channels : str
        ``"tree"``: one channel per (sender, receiver, tree); ``"link"``: one
        per (sender, receiver). See :mod:`jax_blink.sim.simulator`.

    Examples
    --------
    >>> SimModel().latency_s("pcie")
    1e-06
    """

    latency_us: dict = dataclasses.field(default_factory=dict)
    step_overhead_us: float = 1.0
    reduce_gbps: float | None = None
    channels: str = "tree"

    def __post_init__(self):
        if self.channels not in ("tree", "link"):
            raise SimError(f"SimModel.channels must be 'tree' or 'link', got {self.channels!r}")
        if not self.step_overhead_us >= 0:
            raise SimError(f"SimModel.step_overhead_us must be >= 0, got {self.step_overhead_us}")
        if self.reduce_gbps is not None and not self.reduce_gbps > 0:
            raise SimError(f"SimModel.reduce_gbps must be > 0, got {self.reduce_gbps}")
        for kind, value in self.latency_us.items():
            if not value >= 0:
                raise SimError(f"SimModel.latency_us[{kind!r}] must be >= 0, got {value}")

    def reducer_gbps(self, topology) -> float:
        """The reduction throughput used on ``topology`` (see :attr:`reduce_gbps`)."""
        if self.reduce_gbps is not None:
            return self.reduce_gbps
        return topology.reduce_gbps if topology.reduce_gbps is not None else DEFAULT_REDUCE_GBPS

    def latency_s(self, kind: str) -> float:
        """Latency of one arc of link kind ``kind``, in seconds."""
        if kind in self.latency_us:
            return self.latency_us[kind] * 1e-6
        if kind not in LATENCY_US:
            raise SimError(f"no latency for link kind {kind!r}; give SimModel(latency_us={{{kind!r}: ...}})")
        return latency_s(kind)

    def route_latency_s(self, graph, arcs) -> float:
        """Sum of the latencies of ``arcs`` (indices into ``graph``, a :class:`~jax_blink.topo.LinkGraph`)."""
        return sum(self.latency_s(graph.arc_kind[a]) for a in arcs)
