#!/usr/bin/env python3
"""Seeded completions of a prompt that starts a Python function, and whether each one's first function
parses (issue 25's check of the bundled model; no dependencies beyond the standard library).

The first function is the prompt plus the completion up to the first later line that is neither blank
nor indented (a dedent to column 0 ends the function). A completion that stops inside the function
(the token limit) is judged on what it wrote: a function cut mid-statement does not parse, so it fails.

Usage: tools/first_function.py [--strata build/strata] [-m MODEL] [--seeds 10] [-n 96] [--prompt TEXT]
                               [--show]
"""
import argparse
import ast
import subprocess
import sys


def first_function(text):
    lines = text.split("\n")
    body = [lines[0]]
    for line in lines[1:]:
        if line.strip() and not line[0].isspace():
            break
        body.append(line)
    return "\n".join(body)


def parses(source):
    try:
        ast.parse(source)
        return True
    except SyntaxError:  # IndentationError is one
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: strata's bundled model)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds 1..N")
    ap.add_argument("-n", type=int, default=96, help="tokens per completion")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--show", action="store_true", help="print each first function")
    args = ap.parse_args()
    if not args.prompt.lstrip().startswith("def "):
        sys.exit("--prompt must start a function (def ...)")
    passed = 0
    for seed in range(1, args.seeds + 1):
        cmd = [args.strata, "run", "-n", str(args.n), "-s", str(seed)]
        if args.model:
            cmd += ["-m", args.model]
        run = subprocess.run(cmd + [args.prompt], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"seed {seed}: {' '.join(cmd)} failed:\n{run.stderr}")
        fn = first_function(args.prompt + run.stdout)
        ok = parses(fn)
        passed += ok
        print(f"seed {seed}: {'parses' if ok else 'does not parse'} ({len(fn.splitlines())} lines)")
        if args.show:
            print(fn + "\n---")
    print(f"{passed} of {args.seeds} first functions parse")


if __name__ == "__main__":
    main()
