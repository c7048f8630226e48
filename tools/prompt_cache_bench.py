#!/usr/bin/env python3
"""Prompt cache benchmark: time to first token of a five-turn agent conversation (stdlib only).

Starts `strata serve` (one slot, CPU) twice on a free loopback port. With the prompt cache on, it runs a
five-turn agent conversation (a long system prompt of tool descriptions, ~4k tokens by turn 5) whose
turns are streamed greedily; between turns another client's unrelated request takes the slot, so each
turn must come back from the cache, not from what the slot still holds. Then, on a server started with
--cache-ram 0, it sends turn 5's exact messages cold. Prints each turn's prompt tokens, cached tokens
and TTFT, and turn 5's TTFT as a share of the cold one; exit status 1 when the share is above --max-share.

Usage: prompt_cache_bench.py STRATA_BINARY [--model M] [--cold-runs 2] [--max-share 0.2] [--no-interleave]
"""
import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request

TOOLS = ["read_file", "write_file", "list_dir", "grep", "run_tests", "git_diff", "git_commit", "http_get",
         "search_docs", "edit_lines", "format_code", "open_issue"]


def system_prompt():
    lines = ["You are a coding agent working in a repository. You may call these tools:"]
    for i, name in enumerate(TOOLS):
        lines.append(f"- {name}: takes arguments path, pattern, start_line, end_line and options {i}; returns "
                     f"the result as text. Use {name} when the task needs it, and explain what you found in "
                     f"plain words before the next step. Never call {name} twice with the same arguments; "
                     f"report errors from {name} verbatim, with the exit status and the first lines of output.")
    lines.append("Rules: keep answers short, cite file paths, prefer small changes, run the tests after each edit.")
    return "\n".join(lines * 3)


USER_TURNS = [
    "The test suite fails in tests/test_parser.cpp with a crash on empty input. Find the cause.",
    "The tool returned: parser.cpp line 88 reads tokens[0] without checking size. Propose a fix.",
    "I applied it. run_tests now reports 2 failures in test_lexer. What should we check next?",
    "grep found that lexer.cpp also assumes a non-empty buffer at line 140. Summarise both fixes.",
    "Write the commit message for both fixes, then list the follow-up work as bullet points.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, model, cache_mib):
    port = free_port()
    cmd = [binary, "serve", "--port", str(port), "--slots", "1", "--ctx", "8192", "--cache-ram", str(cache_mib)]
    if model:
        cmd += ["-m", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            sys.exit("strata serve exited: " + proc.stderr.read())
        time.sleep(0.1)
    proc.kill()
    sys.exit("strata serve did not become ready")


def chat(url, messages, max_tokens):
    """Streams a greedy chat completion; returns (text, ttft seconds, usage)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=1200) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
    return text, (ttft if ttft is not None else time.perf_counter() - t0), usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--model", default="")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--cold-runs", type=int, default=2)
    ap.add_argument("--max-share", type=float, default=0.2)
    ap.add_argument("--no-interleave", action="store_true")
    a = ap.parse_args()

    proc, url = start(a.binary, a.model, 2048)
    try:
        messages = [{"role": "system", "content": system_prompt()}]
        turns = []
        for i, user in enumerate(USER_TURNS):
            messages.append({"role": "user", "content": user})
            if i == len(USER_TURNS) - 1:
                turn5 = [dict(m) for m in messages]
            text, ttft, usage = chat(url, messages, a.max_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            turns.append((usage["prompt_tokens"], cached, ttft))
            print(f"turn {i + 1}: {usage['prompt_tokens']} prompt tokens, {cached} cached, TTFT {ttft * 1000:.1f} ms")
            messages.append({"role": "assistant", "content": text})
            if not a.no_interleave:
                chat(url, [{"role": "user", "content": f"Another client's question number {i}: what is a mutex?"}], 8)
    finally:
        proc.terminate()
        proc.wait()

    proc, url = start(a.binary, a.model, 0)
    try:
        colds = []
        for _ in range(a.cold_runs):
            _, ttft, usage = chat(url, turn5, 1)
            colds.append(ttft)
            print(f"cold turn 5 (--cache-ram 0): {usage['prompt_tokens']} prompt tokens, TTFT {ttft * 1000:.1f} ms")
    finally:
        proc.terminate()
        proc.wait()
    cold = min(colds)
    share = turns[-1][2] / cold
    print(f"turn 5 TTFT {turns[-1][2] * 1000:.1f} ms vs cold {cold * 1000:.1f} ms (best of {len(colds)}): "
          f"{share * 100:.1f}% of cold (target <= {a.max_share * 100:.0f}%)")
    return 0 if share <= a.max_share else 1


if __name__ == "__main__":
    sys.exit(main())
