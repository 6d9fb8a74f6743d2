import json,glob,sys
for f in sorted(glob.glob('perf/results/isolate-ab-2026-11-27T1947Z/r*-iso*.jsonl')):
    print('==',f.split("/")[-1])
    for l in open(f):
        d=json.loads(l)
        if d.get('kind')=='search':
            tr=d['search']['trials']
            print(' ',d['path'],d['profile'],'nodrop',round(d['no_drop_pps']/1e6,3), ' '.join(f"{t['tx_pps']/1e6:.3f}:{t['loss']*100:.3f}%/{t['latency_ns']['max']/1e6:.1f}ms" for t in tr))
