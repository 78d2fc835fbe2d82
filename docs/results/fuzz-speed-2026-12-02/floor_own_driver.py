"""The same draws as floor_stateful.py without RuleBasedStateMachine: one @given(st.data()) example that draws
the set-up, then per step the state machine's stop coin (p = 2**-16, forced at the last step), a rule index and
the rule's arguments; nothing runs.  ``list`` mode draws the whole op list up front instead.

    PYTHONPATH=HYPOTHESIS_DIR python floor_own_driver.py data|list EXAMPLES STEPS
"""
import time, gc, sys
from hypothesis import given, settings, seed, HealthCheck, strategies as st
BLOCKS = st.one_of(st.just(64), st.integers(6, 12), st.integers(3, 5))
SETUPS = st.tuples(st.integers(0, 2), BLOCKS, st.integers(0, 2), st.integers(0, 2), st.sampled_from((16,4,2)))
KNOBS = st.tuples(st.sampled_from((8,16,32)), st.sampled_from(("fcfs","priority")), st.sampled_from((0, 8, 24)), st.booleans(), st.booleans(), st.booleans())
LENGTHS = st.one_of(st.integers(1, 12), st.integers(13, 40))
REQUESTS = st.tuples(st.integers(0, 5), LENGTHS, st.integers(1, 16), st.integers(0, 2))
RULES = [("add_request", st.tuples(REQUESTS)), ("add_burst", st.tuples(st.lists(REQUESTS, min_size=2, max_size=5))),
 ("add_session", st.tuples(REQUESTS)), ("feed", st.tuples(st.integers(0,7), REQUESTS)), ("close", st.tuples(st.integers(0,7))),
 ("step", st.tuples(st.integers(1,8))), ("drain", st.just(())), ("pop", st.just(())), ("reset", st.tuples(st.sampled_from((None,0,1,2)), st.booleans())),
 ("pause", st.tuples(st.sampled_from(("keep","abort","wait")))), ("resume", st.just(())), ("abort", st.tuples(st.integers(0,7))),
 ("abort_several", st.tuples(st.lists(st.integers(0, 7), min_size=2, max_size=4))), ("abort_all", st.just(())), ("abort_mid_prefill", st.tuples(st.integers(0,7)))]
mode = sys.argv[1]; ex=int(sys.argv[2]); steps=int(sys.argv[3])
N=[0]
OPS = st.one_of(*[st.tuples(st.just(n), s) for n, s in RULES])
cfg = settings(max_examples=ex, deadline=None, database=None, suppress_health_check=list(HealthCheck))
if mode == "data":
    @seed(1)
    @cfg
    @given(st.data())
    def t(data):
        N[0]+=1
        data.draw(SETUPS); data.draw(KNOBS); data.draw(st.lists(REQUESTS, min_size=1, max_size=4))
        for i in range(steps):
            if data.conjecture_data.draw_boolean(p=2**-16, forced=True if i >= steps-1 else None): break
            k = data.draw(st.integers(0, len(RULES)-1))
            data.draw(RULES[k][1])
elif mode == "list":
    @seed(1)
    @cfg
    @given(SETUPS, KNOBS, st.lists(REQUESTS, min_size=1, max_size=4), st.lists(OPS, max_size=steps))
    def t(a, b, c, ops):
        N[0]+=1
gc.freeze(); c0=time.process_time(); t(); c=time.process_time()-c0
print(mode, f"examples {N[0]} {N[0]/c:.1f} ex/cpu s {1000*c/N[0]:.2f} ms/ex")
