"""The async twins (and draftless controls) of cont_mt2_c1: python3 variants.py; python3 async_variants.py -> async_spec.json."""
import json, copy
V = json.load(open('variants.json'))
base = V['cont_mt2_c1']
out = {}
for name, upd in {'a2_spec': dict(scheduler='async', depth=2),
                  'a2_nospec': dict(scheduler='async', depth=2, spec_tokens=0, spec_accepted=0),
                  'a2_spec_acc0': dict(scheduler='async', depth=2, spec_accepted=0),
                  'sync_nospec': dict(spec_tokens=0, spec_accepted=0)}.items():
    out[name] = dict(copy.deepcopy(base), **upd)
V.update(out)
json.dump(V, open('variants.json', 'w'))
spec = json.load(open('spec.json'))
spec['scenarios'] = [{'id': n, 'scenario': 'ops', 'params': p} for n, p in out.items()]
json.dump(spec, open('async_spec.json', 'w'))
