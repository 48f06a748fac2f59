"""Which process owns each device of a call, and the host transport.

* :mod:`~jax_blink.processes.layout`: a call's process layout (in one process, the
  processes of one host, or spanning hosts), read from the mesh, the same in every process.
* :mod:`~jax_blink.processes.transport`: which processes share a host, and the shared-memory
  arenas of the host transport.

The collectives over a spanning layout are the front end's
(:mod:`jax_blink.ops.hierarchical`): they are built of the ops.
"""
