"""A reference executor for the planning tests: a schedule run on numpy arrays.

Each rank runs, in list order among those ready, any step whose
dependencies are done (a RECV once its SEND is done), with value semantics
(a RECV gets the value its SEND had when sent), as
``docs/schedule_format.md`` specifies.
"""

import numpy as np


def numpy_execute(schedule, inputs):
    """Run a schedule on numpy arrays, any ready step first, with value semantics."""
    acc = [x.astype(np.float64).copy() for x in inputs]
    sent = {}
    done = [[False] * len(s) for s in schedule.steps]
    left = sum(len(s) for s in schedule.steps)
    while left:
        progressed = False
        for r, steps in enumerate(schedule.steps):
            for i, s in enumerate(steps):
                if done[r][i] or not all(done[r][d] for d in s.deps):
                    continue
                lo, n = schedule.chunks[s.chunk]
                if s.op == "SEND":
                    sent[(r, s.peer, s.chunk)] = acc[r][lo:lo + n].copy()
                elif (s.peer, r, s.chunk) in sent:
                    v = sent[(s.peer, r, s.chunk)]
                    acc[r][lo:lo + n] = acc[r][lo:lo + n] + v if s.op == "RECV_REDUCE" else v
                else:
                    continue
                done[r][i] = True
                left -= 1
                progressed = True
        assert progressed, "deadlock"
    return acc
