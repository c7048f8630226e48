#!/usr/bin/env python3
"""Renders the chat-template fixtures with Hugging Face transformers (the real Qwen3 template).

Reads tests/fixtures/chat/cases.json (a list of {name, messages, tools?, add_generation_prompt,
enable_thinking?}) and writes tests/fixtures/chat/expected.json ({name: rendered prompt}).
enable_thinking is passed to the template only when the case sets it (otherwise it stays undefined).

Usage (on the GPU machine; carry build-data/qwen3-tokenizer there):
    python3 tools/make_chat_expected.py --tokenizer-dir build-data/qwen3-tokenizer \
        tests/fixtures/chat/cases.json
"""
import argparse
import json
import os

from transformers import AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("cases")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    out = {}
    for case in cases:
        kwargs = {"tokenize": False, "add_generation_prompt": case["add_generation_prompt"]}
        if case.get("tools"):
            kwargs["tools"] = case["tools"]
        if "enable_thinking" in case:
            kwargs["enable_thinking"] = case["enable_thinking"]
        out[case["name"]] = tok.apply_chat_template(case["messages"], **kwargs)
    path = os.path.join(os.path.dirname(args.cases), "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(out)} cases")


if __name__ == "__main__":
    main()
