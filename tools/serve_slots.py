#!/usr/bin/env python3
"""Concurrent greedy requests against a running `strata serve` (stdlib only).

Sends N distinct completion prompts one at a time (each alone on the server), then all N at once, and
prints: tokens and seconds of each, the aggregate completion tokens/s of the concurrent round against
the mean tokens/s of the requests alone, and whether every concurrent output equals its run alone.
Exit status 1 when an output differs. Usage: serve_slots.py URL [--n 4] [--max-tokens 128]
"""
import argparse
import json
import sys
import threading
import time
import urllib.request


def complete(url, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    dt = time.perf_counter() - t0
    return out["choices"][0]["text"], out["usage"]["completion_tokens"], dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    prompts = [f"Request {i}: the numbers {i}, {i * 7 + 3}, {i * 13 + 5} and" for i in range(a.n)]
    complete(a.url, "warm up", 8)
    alone = [complete(a.url, p, a.max_tokens) for p in prompts]
    results = [None] * a.n

    def worker(i):
        results[i] = complete(a.url, prompts[i], a.max_tokens)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    same = True
    for i in range(a.n):
        eq = results[i][0] == alone[i][0]
        same &= eq
        print(f"request {i}: alone {alone[i][1]} tokens in {alone[i][2]:.3f} s, concurrent {results[i][1]} tokens "
              f"in {results[i][2]:.3f} s, output {'identical' if eq else 'DIFFERS'}")
    one = sum(x[1] for x in alone) / sum(x[2] for x in alone)
    agg = sum(x[1] for x in results) / wall
    print(f"alone: {one:.1f} tok/s per request; {a.n} concurrent: {agg:.1f} tok/s aggregate = {agg / one:.2f}x; "
          f"outputs {'identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
