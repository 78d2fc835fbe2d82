import pstats, sys, collections
st = pstats.Stats(sys.argv[1]); tot = collections.Counter()
for (fn, ln, name), (cc, nc, tt, ct, callers) in st.stats.items():
    if '/hypothesis/' in fn: k = 'hypothesis'
    elif '/vllm/' in fn: k = 'vllm'
    elif '/repro/' in fn: k = 'repro:' + fn.split('/repro/')[1]
    elif 'pydantic' in fn: k = 'pydantic'
    elif fn.startswith('~') or fn == '~': k = 'builtins:' + name[:40]
    else: k = 'other:' + fn.split('/')[-1]
    tot[k] += tt
T = sum(tot.values()); print('total tottime', round(T,3))
for k, v in tot.most_common(30): print(f'{v:7.3f} {100*v/T:5.1f}% {k}')
