import re,collections,sys
def load(fn):
    d=collections.defaultdict(list); rnd=None
    for line in open(fn):
        m=re.match(r'== attention decode round (\d)',line)
        if m: rnd=m.group(1); continue
        if line.startswith('== '): rnd=None; continue
        m=re.match(r'(decode|decode_lanes|decode_factor)\s+kv=bf16\s+batch=(\d+)\s+ctx=(\d+).*graph_us=\s*([\d.]+).*frac_copy=([\d.]+)(.*)',line)
        if m and rnd:
            kind=m.group(1)+(m.group(6).strip().replace('sets=','').split()[-1] if m.group(1)=='decode_factor' else '')
            d[(kind,int(m.group(2)),int(m.group(3)))].append((float(m.group(4)),float(m.group(5))))
        m=re.match(r'(sdpa decode|flashinfer decode\s+tc)\s+batch=(\d+)\s+ctx=(\d+)\s+graph_us=\s*([\d.]+).*frac_copy=([\d.]+)',line)
        if m: d[(m.group(1).split()[0],int(m.group(2)),int(m.group(3)))].append((float(m.group(4)),float(m.group(5))))
    return d
import statistics
def med(v): return statistics.median([x[0] for x in v]) if v else float('nan')
def medf(v): return statistics.median([x[1] for x in v]) if v else float('nan')
d=load(sys.argv[1])
print("| batch x ctx | per-lane | tensor cores | frac copy | SDPA | FlashInfer tc | tc / per-lane | tc / SDPA | tc / FlashInfer |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
for b in (1,16,64,256):
  for c in (512,4096,16384):
    ln=med(d[('decode_lanes',b,c)]); mm=med(d[('decode',b,c)]); f=medf(d[('decode',b,c)]); s=med(d[('sdpa',b,c)]); fi=med(d[('flashinfer',b,c)])
    cs={512:'512',4096:'4K',16384:'16K'}[c]
    print(f"| {b} x {cs} | {ln:.2f} | {mm:.2f} | {f:.3f} | {s:.2f} | {fi:.2f} | {mm/ln:.2f} | {mm/s:.2f} | {mm/fi:.2f} |")
