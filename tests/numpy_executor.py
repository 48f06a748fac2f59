"""A reference executor for the planning tests: a schedule run on numpy arrays.

Steps run in each rank's list order with value semantics (a RECV gets the
value its SEND had when sent), as ``docs/schedule_format.md`` specifies.
"""

import numpy as np


def numpy_execute(schedule, inputs):
    """Run a schedule on numpy arrays, in list order, with value semantics."""
    acc = [x.astype(np.float64).copy() for x in inputs]
    sent, pos = {}, [0] * schedule.nranks
    while any(p < len(s) for p, s in zip(pos, schedule.steps)):
        progressed = False
        for r, steps in enumerate(schedule.steps):
            while pos[r] < len(steps):
                s = steps[pos[r]]
                lo, n = schedule.chunks[s.chunk]
                if s.op == "SEND":
                    sent[(r, s.peer, s.chunk)] = acc[r][lo:lo + n].copy()
                elif (s.peer, r, s.chunk) in sent:
                    v = sent[(s.peer, r, s.chunk)]
                    acc[r][lo:lo + n] = acc[r][lo:lo + n] + v if s.op == "RECV_REDUCE" else v
                else:
                    break
                pos[r] += 1
                progressed = True
        assert progressed, "deadlock"
    return acc
