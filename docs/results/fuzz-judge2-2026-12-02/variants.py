"""Minimisation variants of session-spec-sync.plan.json, written as one repro.sched spec (spec.json, many scenarios)
and variants.json in the current folder:  python3 variants.py [NAME ...]  (default: all), then, with a vLLM env's python
from the repository root:  PYTHONPATH=. ENV/bin/python -m repro.sched spec.json out.jsonl; python3 summarize.py out.jsonl"""
import copy, json, sys
from pathlib import Path
base = json.load(open(Path(__file__).with_name('session-spec-sync.plan.json')))['script']
V = {}
def var(name, f):
    s = copy.deepcopy(base); f(s); V[name] = s
var('orig', lambda s: None)
var('no_drafts', lambda s: s.update(spec_tokens=0, spec_accepted=0))
var('drafts_acc0', lambda s: s.update(spec_accepted=0))
var('drafts_acc1', lambda s: s.update(spec_accepted=1))
var('spec1', lambda s: s.update(spec_tokens=1, spec_accepted=1))
var('no_prefix', lambda s: s.update(enable_prefix_caching=False))
def no_r0(s):
    s['requests'] = s['requests'][1:]; s['ops'] = s['ops'][2:]
var('no_r0', no_r0)
def r0_nostep(s): s['ops'] = [o for o in s['ops'] if o['op'] != 'step']
var('r0_nostep', r0_nostep)
def r0_done(s):  # r0 runs to completion first
    s['ops'][1] = {'op': 'run'}
var('r0_done_first', r0_done)
def no_feed(s):
    s['ops'] = [o for o in s['ops'] if o['op'] != 'feed']; s['requests'][1].pop('chunks')
var('no_feed', no_feed)
def no_close(s): s['ops'] = [o for o in s['ops'] if o['op'] != 'close']
var('no_close', no_close)
def no_feed_close(s):
    s['ops'] = [o for o in s['ops'] if o['op'] not in ('feed', 'close')]; s['requests'][1].pop('chunks')
var('no_feed_no_close', no_feed_close)
def not_session(s):
    s['ops'] = [o for o in s['ops'] if o['op'] not in ('feed', 'close')]; r = s['requests'][1]; r.pop('chunks'); r.pop('session')
var('r2_plain', not_session)
def step_between(s):  # a step after add r2 before feeding
    s['ops'].insert(3, {'op': 'step'})
var('step_before_feed', step_between)
def feed_other(s): s['requests'][1]['chunks'] = [[[5], 1]]
var('chunk_5', feed_other)
def prompt_other(s): s['requests'][1]['prompt'] = [7]
var('r2_prompt_7', prompt_other)
def chunk_long(s): s['requests'][1]['chunks'] = [[[2, 3, 4], 1]]
var('chunk_3tok', chunk_long)
def mt2(s): s['requests'][1]['max_tokens'] = 2
var('r2_max2', mt2)
def cmt2(s): s['requests'][1]['chunks'] = [[[2], 2]]
var('chunk_max2', cmt2)
def r0_short(s): s['requests'][0]['prompt'] = [3, 4, 5]
var('r0_prompt3', r0_short)
def r0_other(s): s['requests'][0]['prompt'] = [20 + i for i in range(25)]
var('r0_prompt_nooverlap', r0_other)
def r0_mt1(s): s['requests'][0]['max_tokens'] = 1
var('r0_max1', r0_mt1)
def r0_mt20(s): s['requests'][0]['max_tokens'] = 20
var('r0_max20', r0_mt20)
# --- real drafts (a continuing decode, not padding): the turn's last step accepts drafts past max_tokens
def cont(s, prompt, mt, chunk, with_r0=False, acc=2):
    s['spec_accepted'] = acc
    r2 = {'rid': 'r2', 'prompt': prompt, 'max_tokens': mt, 'session': True, 'chunks': [[chunk, 1]]}
    s['requests'] = ([s['requests'][0]] if with_r0 else []) + [r2]
    s['ops'] = ([{'op': 'add', 'rid': 'r0'}] if with_r0 else []) + [
        {'op': 'add', 'rid': 'r2'}, {'op': 'feed', 'rid': 'r2'}, {'op': 'close', 'rid': 'r2'}, {'op': 'run'}]
for mt in (2, 3, 4):
    for cl in (1, 2):
        var(f'cont_mt{mt}_c{cl}', lambda s, mt=mt, cl=cl: cont(s, [3, 4, 5, 6, 7], mt, [2] * cl))
var('cont_mt2_c1_acc1', lambda s: cont(s, [3, 4, 5, 6, 7], 2, [2], acc=1))
var('cont_mt2_c1_r0', lambda s: cont(s, [3, 4, 5, 6, 7], 2, [2], with_r0=True))
names = sys.argv[1:] or list(V)
spec = {'schema_version': 2, 'version_label': 'x', 'model_cache': '/root/.cache/vllm-repro-tests/vllm-repro/models',
        'model': {'kind': 'bigram-cycle', 'params': {}}, 'fsync': False}
spec['scenarios'] = [{'id': n, 'scenario': 'ops', 'params': V[n]} for n in names]
json.dump(spec, open('spec.json', 'w'))
json.dump(V, open('variants.json', 'w'), indent=1)
for n in list(V):
    if n.startswith('cont_') or n == 'orig':
        V[n + '_async2'] = dict(copy.deepcopy(V[n]), scheduler='async', depth=2)
        V[n + '_async3'] = dict(copy.deepcopy(V[n]), scheduler='async', depth=3)
names = sys.argv[1:] or list(V)
spec['scenarios'] = [{'id': n, 'scenario': 'ops', 'params': V[n]} for n in names]
json.dump(spec, open('spec.json', 'w'))
json.dump(V, open('variants.json', 'w'), indent=1)
