#!/usr/bin/env python3
"""Summarises the logs of .ci/loaded-runs.sh (DIR/loaded-run-*.log) into the reliability tables of docs/reliability.md.

    python3 .ci/loaded-summary.py DIR
"""
import re, sys, glob, collections
logs = sorted(glob.glob(sys.argv[1] + '/loaded-run-*.log'), key=lambda p: int(re.findall(r'(\d+)\.log', p)[0]))
chaos = collections.defaultdict(lambda: dict(runs=0, holds=[], lost=0, maxvalid=0, stale=0, back=0.0, ok=0))
nl = collections.defaultdict(lambda: dict(runs=0, lost=0, inside=0, wait=0.0))
def secs(s):
    m = re.match(r'([\d.]+)(ms|s|µs)', s)
    v = float(m.group(1))
    return v / 1000 if m.group(2) == 'ms' else v / 1e6 if m.group(2) == 'µs' else v
results = []
for p in logs:
    txt = open(p).read()
    results.append((p, 'FAIL' not in re.findall(r'^(ok|FAIL)\b', txt, re.M) and re.search(r'^ok\s+\S+/cmd/seminit', txt, re.M) is not None))
    for m in re.finditer(r'harness_test.go:\d+: (\S+)/short: (\d+) holds \((\d+) lost\).*?max valid holders (\d+).*?stale overlaps (\d+)(?:; killed holder\'s slot back after .*? max (\S+) \(n=\d+\))?; porcupine: (\w+)', txt):
        c = chaos[m.group(1)]
        c['runs'] += 1; c['holds'].append(int(m.group(2))); c['lost'] += int(m.group(3))
        c['maxvalid'] = max(c['maxvalid'], int(m.group(4))); c['stale'] = max(c['stale'], int(m.group(5)))
        if m.group(6): c['back'] = max(c['back'], secs(m.group(6)))
        c['ok'] += m.group(7) == 'Ok'
    test = None
    for line in txt.splitlines():
        r = re.match(r'=== RUN   (TestNodeLoss\w+)$', line)
        if r: test = r.group(1)
        m = re.search(r'codes by node .*max (\d+) inside of \d+.*?(\d+) permits lost; longest wait for a permit after the kill: (\S+)', line)
        if m and test:
            n = nl[test]; n['runs'] += 1; n['lost'] += int(m.group(2)); n['inside'] = max(n['inside'], int(m.group(1)))
            n['wait'] = max(n['wait'], secs(m.group(3)))
print(f"{sum(ok for _, ok in results)} of {len(results)} logs passed")
print('| scenario | runs | holds per run | lost holds | max valid holders (N=3) | stale overlaps (max) | killed holder\'s slot back (max) | porcupine |')
print('|---|---|---|---|---|---|---|---|')
for k in ['nats', 'nats-cluster', 'amqp', 'amqp-cluster']:
    c = chaos[k]
    if c['runs']:
        print(f"| {k} | {c['runs']} | {min(c['holds'])}–{max(c['holds'])} | {c['lost']} | {c['maxvalid']} | {c['stale']} | {c['back']:.2f} s | {c['ok']}/{c['runs']} Ok |")
print()
print('| scenario | runs | permits lost (total) | max inside (N=3) | longest wait after the kill (max) |')
print('|---|---|---|---|---|')
for k, n in nl.items():
    print(f"| {k} | {n['runs']} | {n['lost']} | {n['inside']} | {n['wait']:.1f} s |")
