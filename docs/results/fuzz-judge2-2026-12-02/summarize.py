import json, sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e['event'] == 'scenario':
        recs = {r['rid']: (r['observed'], r['finish_reason']) for r in e.get('records', [])}
        print(f"{e['id']:22s} {e['status']:6s} {e.get('reason','')[:110]} {recs if e['status']!='crash' else ''} {e.get('stalled') or ''}")
    elif e['event'] in ('fatal',): print(e)
