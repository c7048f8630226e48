#!/usr/bin/env python3
"""The server load test of tests/serve/load.mjs, for machines without Node (the GPU machine): stdlib only.

CLIENTS concurrent clients each make REQUESTS streamed chat requests one after another.
mode "complete": every stream must finish with usage that matches the prompt's token count and the
max_tokens limit, and the server's completion-token counter must grow by exactly what the clients saw.
mode "disconnect": clients close their connections at random points (after 0-3 text chunks or a random
delay); afterwards the server must have cancelled some generations.
Both: every slot free and the queue empty within 10 s, /health answering. Exit status 1 on any failure.
Usage: serve_load.py URL MODEL CLIENTS REQUESTS MAX_TOKENS MODE
"""
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse
import urllib.request

PROMPTS = ["Tell me a story.", "What is 2+2?", "Name a color.", "Write a haiku about rain."]


def conv(i):
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def post_json(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
    raise RuntimeError(f"metric {name} not found")


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def one_request(base, model, k, max_tokens, mode, prompt_tokens, stats, lock):
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = {"model": model, "messages": conv(k), "max_tokens": max_tokens, "temperature": 0.7, "seed": k,
            "stream": True, "stream_options": {"include_usage": True}}
    abort_after = random.randrange(4) if mode == "disconnect" else None
    deadline = time.monotonic() + random.randrange(150) / 1000.0 if mode == "disconnect" else None
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    check(resp.status == 200, f"request {k}: status {resp.status}")
    usage, finish, chunks = None, None, 0
    aborted = False
    while True:
        if mode == "disconnect" and (chunks >= abort_after or time.monotonic() >= deadline):
            aborted = True
            break
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
            d = ch.get("delta", {})
            if d.get("content") or d.get("reasoning_content"):
                chunks += 1
    if aborted:
        conn.sock.close()  # the client vanishes mid-stream
        conn.close()
        with lock:
            stats["aborted"] += 1
        return
    conn.close()
    want = prompt_tokens[k % len(PROMPTS)]
    check(usage is not None, f"request {k}: usage in the last chunk")
    check(usage["prompt_tokens"] == want, f"request {k}: prompt_tokens {usage['prompt_tokens']} == {want}")
    n = usage["completion_tokens"]
    check(1 <= n <= max_tokens, f"request {k}: completion_tokens {n} in [1, {max_tokens}]")
    if finish == "length":
        check(n == max_tokens, f"request {k}: length => {max_tokens} tokens")
    check(chunks <= n, f"request {k}: no more text chunks than tokens")
    with lock:
        stats["completed"] += 1
        stats["seen"] += n


def main():
    base, model, clients, requests, max_tokens, mode = sys.argv[1:7]
    clients, requests, max_tokens = int(clients), int(requests), int(max_tokens)
    base = base.rstrip("/")
    prompt_tokens = [len(post_json(base, "/tokenize", {"messages": conv(i)})["tokens"]) for i in range(len(PROMPTS))]
    before = metric(base, "strata_completion_tokens_total")
    cancelled_before = metric(base, "strata_requests_cancelled_total")
    stats = {"completed": 0, "aborted": 0, "seen": 0}
    lock = threading.Lock()
    errors = []

    def worker(c):
        try:
            for r in range(requests):
                one_request(base, model, c * requests + r, max_tokens, mode, prompt_tokens, stats, lock)
        except Exception as e:  # noqa: BLE001 -- every failure is reported
            errors.append(f"client {c}: {e}")

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        check(not errors, "; ".join(errors[:5]))
        if mode == "complete":
            check(stats["completed"] == clients * requests,
                  f"all {clients * requests} requests completed ({stats['completed']})")
            after = metric(base, "strata_completion_tokens_total")
            check(after - before == stats["seen"], f"server counted {after - before} completion tokens, clients saw {stats['seen']}")
        else:
            check(stats["aborted"] > 0, "some requests were aborted")
        deadline = time.monotonic() + 10
        busy = queued = -1
        while time.monotonic() < deadline:
            busy, queued = metric(base, "strata_slots_busy"), metric(base, "strata_queue_depth")
            if busy == 0 and queued == 0:
                break
            time.sleep(0.1)
        check(busy == 0 and queued == 0, f"slots free after the round (busy {busy}, queued {queued})")
        if mode == "disconnect":
            cancelled = metric(base, "strata_requests_cancelled_total") - cancelled_before
            check(cancelled > 0, "the server cancelled generations of vanished clients")
        with urllib.request.urlopen(base + "/health", timeout=30) as r:
            check(r.status == 200, "healthy after the round")
    except Failure as e:
        print(f"load {mode}: FAILED: {e}")
        sys.exit(1)
    print(f"load {mode}: {stats['completed']} completed, {stats['aborted']} aborted")


if __name__ == "__main__":
    main()
