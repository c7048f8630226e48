#!/usr/bin/env python3
"""Writes the expected token ids of the tokenizer fixtures with Hugging Face `tokenizers`.

For every TEXT.txt given, encodes its contents (read as UTF-8, exactly, no newline translation) with
the tokenizer.json and writes TEXT.ids next to it: the ids, comma-separated, on one line (the format
`strata tokenize` prints). Special tokens written in the text are recognised as HF recognises them
(add_special_tokens=False: Qwen's post-processor adds nothing either way).

Usage (on the GPU machine, where `tokenizers` is installed; carry build-data/qwen3-tokenizer there):
    python3 tools/make_tokenizer_expected.py --tokenizer build-data/qwen3-tokenizer/tokenizer.json \
        tests/fixtures/tokenizer/*.txt
"""
import argparse
import sys

from tokenizers import Tokenizer
import tokenizers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="path of tokenizer.json")
    ap.add_argument("texts", nargs="+", help="fixture .txt files")
    args = ap.parse_args()

    tok = Tokenizer.from_file(args.tokenizer)
    print(f"tokenizers {tokenizers.__version__}, {args.tokenizer}", file=sys.stderr)
    for path in args.texts:
        if not path.endswith(".txt"):
            sys.exit(f"{path}: expected a .txt fixture")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")  # fixtures are valid UTF-8 by construction
        ids = tok.encode(text, add_special_tokens=False).ids
        out = path[: -len(".txt")] + ".ids"
        with open(out, "w") as f:
            f.write(",".join(str(i) for i in ids) + "\n")
        print(f"{out}: {len(ids)} ids", file=sys.stderr)


if __name__ == "__main__":
    main()
