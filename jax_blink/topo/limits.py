"""The limits every topology obeys: how many nodes, and the range of link bandwidths.

:class:`~jax_blink.topo.Topology` refuses anything outside them with a
:class:`~jax_blink.topo.TopologyError` naming the value and the limit, before
doing work sized by it. The bandwidth range spans every real interconnect
with room to spare (from a 10 kbit/s serial line to a petabyte per second)
and keeps the planner's LP well conditioned; the node limit is the schedule
format's rank limit (``docs/schedule_format.md``).

Pure Python: never imports jax.
"""

__all__ = ["MAX_NODES", "MIN_BANDWIDTH_GBPS", "MAX_BANDWIDTH_GBPS"]

#: Most nodes (ranks and switches together) a topology may have.
MAX_NODES = 65536
#: Slowest link bandwidth accepted, in GB/s per direction (1 kB/s).
MIN_BANDWIDTH_GBPS = 1e-6
#: Fastest link bandwidth accepted, in GB/s per direction, parallel links of
#: one kind between two nodes summed (1 PB/s).
MAX_BANDWIDTH_GBPS = 1e6
