import sys, re, subprocess, collections
f, worker = sys.argv[1], sys.argv[2]
out = subprocess.run(['perf','script','-i',f,'-F','time,trace'],capture_output=True,text=True).stdout
pat = re.compile(r'\s*([\d.]+): .*prev_comm=(.+?) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(.+?) next_pid=(\d+)')
off = None; ran = collections.Counter(); gaps = []; cur=None; t_in=None
oncpu = 0.0; first=None; last=None
for l in out.splitlines():
    m = pat.match(l)
    if not m: continue
    t = float(m.group(1)); pc, ps, nc = m.group(2), m.group(4), m.group(5)
    first = first or t; last = t
    if cur is not None and cur != worker:
        ran[cur] += t - t_in
    if pc.startswith(worker):
        off = (t, ps); ran = collections.Counter()
    if nc.startswith(worker) and off:
        gaps.append((t - off[0], off[1], off[0], dict(ran))); off = None
    cur = nc; t_in = t
tot = last - first
print(f"span {tot:.3f} s, gaps {len(gaps)}, off-cpu total {sum(g[0] for g in gaps)*1e3:.1f} ms")
for st in ('S','R','R+','D'):
    gs=[g for g in gaps if g[1]==st]
    if gs: print(f"  state {st}: {len(gs)} gaps, {sum(g[0] for g in gs)*1e3:.1f} ms, >100us {sum(1 for g in gs if g[0]>1e-4)}, >500us {sum(1 for g in gs if g[0]>5e-4)}")
big = sorted(gaps, reverse=True)[:15]
for g in big:
    top = sorted(g[3].items(), key=lambda x:-x[1])[:4]
    print(f"  {g[0]*1e6:8.0f} us  state {g[1]} at {g[2]:.4f}  ran: " + ", ".join(f"{k} {v*1e6:.0f}us" for k,v in top))
