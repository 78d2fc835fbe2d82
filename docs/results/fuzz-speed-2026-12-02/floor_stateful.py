"""Hypothesis' own cost per example of the fuzzer's state machine, with every rule a no-op.

The same rules, argument strategies and preconditions' shape as repro/sched/fuzz.py's SchedulerMachine (at
2026-12-02), bodies that do nothing, Hypothesis' defaults otherwise as run_fuzz sets them:

    PYTHONPATH=HYPOTHESIS_DIR python floor_stateful.py EXAMPLES STEPS     # e.g. 300 25 (the ci profile's steps)
"""
import time, gc, sys
from hypothesis import settings, seed, HealthCheck, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, initialize, precondition, invariant, run_state_machine_as_test
BLOCKS = st.one_of(st.just(64), st.integers(6, 12), st.integers(3, 5))
SETUPS = st.tuples(st.integers(0, 2), BLOCKS, st.integers(0, 2), st.integers(0, 2), st.sampled_from((16,4,2)))
KNOBS = st.tuples(st.sampled_from((8,16,32)), st.sampled_from(("fcfs","priority")), st.sampled_from((0, 8, 24)), st.booleans(), st.booleans(), st.booleans())
LENGTHS = st.one_of(st.integers(1, 12), st.integers(13, 40))
REQUESTS = st.tuples(st.integers(0, 5), LENGTHS, st.integers(1, 16), st.integers(0, 2))
N = [0]
class M(RuleBasedStateMachine):
    def __init__(self):
        super().__init__(); N[0] += 1; self.n = 0
    @initialize(drawn=SETUPS, knobs=KNOBS, first=st.lists(REQUESTS, min_size=1, max_size=4))
    def build(self, drawn, knobs, first): self.n = len(first)
    @precondition(lambda self: self.n < 8)
    @rule(request=REQUESTS)
    def add_request(self, request): self.n += 1
    @precondition(lambda self: self.n < 8)
    @rule(burst=st.lists(REQUESTS, min_size=2, max_size=5))
    def add_burst(self, burst): self.n += 1
    @precondition(lambda self: self.n < 8)
    @rule(request=REQUESTS)
    def add_session(self, request): self.n += 1
    @precondition(lambda self: self.n > 1)
    @rule(pick=st.integers(0, 7), chunk=REQUESTS)
    def feed(self, pick, chunk): pass
    @precondition(lambda self: self.n > 1)
    @rule(pick=st.integers(0, 7))
    def close(self, pick): pass
    @rule(n=st.integers(1, 8))
    def step(self, n): pass
    @rule()
    def drain(self): pass
    @rule()
    def pop(self): pass
    @rule(in_flight=st.sampled_from((None, 0, 1, 2)), connector=st.booleans())
    def reset(self, in_flight, connector): pass
    @rule(mode=st.sampled_from(("keep","abort","wait")))
    def pause(self, mode): pass
    @rule()
    def resume(self): pass
    @precondition(lambda self: self.n > 0)
    @rule(pick=st.integers(0, 7))
    def abort(self, pick): pass
    @rule(picks=st.lists(st.integers(0, 7), min_size=2, max_size=4))
    def abort_several(self, picks): pass
    @rule()
    def abort_all(self): pass
    @rule(pick=st.integers(0, 7))
    def abort_mid_prefill(self, pick): pass
    @invariant()
    def inv(self): pass
ex = int(sys.argv[1]); steps = int(sys.argv[2])
cfg = settings(max_examples=ex, stateful_step_count=steps, deadline=None, database=None, suppress_health_check=list(HealthCheck))
gc.freeze()
c0 = time.process_time()
run_state_machine_as_test(seed(1)(M), settings=cfg)
c = time.process_time() - c0
print(f"examples {N[0]} cpu {c:.2f} s -> {N[0]/c:.1f} ex/cpu s, {1000*c/N[0]:.2f} ms/ex")
