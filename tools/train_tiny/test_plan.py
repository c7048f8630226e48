#!/usr/bin/env python3
"""Checks of the torch-free parts of train.py (plan.py) against the bundled model's files. Plain
python3, no packages: python3 tools/train_tiny/test_plan.py"""

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plan as P  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
GGUF = os.path.join(REPO, "models", "strata-tiny.gguf")
LOG = os.path.join(REPO, "models", "train_log.json")


def shape_of(name):
    return {k: P.PRESETS[name][k] for k in P.SHAPE_KEYS}


def test_counts_and_size_match_the_bundled_file():
    # The bundled model's own shape, MTP head and storage type, as its training log records them.
    with open(LOG) as f:
        log = json.load(f)
    preset, mtp = log["args"]["preset"], log["args"]["mtp"]
    quant = P.PRESETS[preset]["quant"]
    shape = shape_of(preset)
    assert P.count_params(shape, 8192) == log["model"]["n_params"]
    assert P.count_params(shape, 8192, mtp) - P.count_params(shape, 8192) == log["model"]["mtp_params"]
    meta, infos, data_start = P.read_gguf(GGUF)
    assert meta["qwen35moe.block_count"] == 8 + mtp and meta["qwen35moe.expert_count"] == 32
    mine = {name: (role, ne0, rows, layer) for name, role, ne0, rows, layer in P.gguf_tensors(shape, 8192, mtp)}
    assert len(mine) == len(infos), (len(mine), len(infos))
    for name, dims, typ, _ in infos:
        base = name[: -len(".weight")] if name.endswith(".weight") else name[: -len(".bias")] if name.endswith(".bias") else name
        assert base in mine, name
        role, ne0, rows, layer = mine[base]
        assert dims[0] == ne0 and math.prod(dims) == ne0 * rows, (name, dims, ne0, rows)
        assert P.tensor_type(role, ne0, layer, quant, 8) == P.GGML_TYPE_NAMES[typ], (name, typ)
    est, _ = P.gguf_size(shape, 8192, quant, mtp)
    actual = os.path.getsize(GGUF)
    assert abs(est - actual) / actual < 0.002, (est, actual)


def test_presets_fit_the_cap_with_the_mtp_head():
    for name, p in P.PRESETS.items():
        if name == "22m":
            continue  # the bundled shape at bf16; with an MTP head it needs q8_0 (see README)
        size, _ = P.gguf_size(shape_of(name), 8192, p["quant"], mtp=1)
        assert size <= 47e6, (name, size)
    assert P.gguf_size(shape_of("22m"), 8192, "q8_0", mtp=1)[0] <= 47e6


def test_quant_policy():
    # q4_k_m: output Q6_K; down matrices Q6_K in "more bits" layers; rows of 64 fall back to Q8_0.
    assert P.tensor_type("Output", 512, -1, "q4_k_m", 8) == "q6_k"
    assert P.tensor_type("ExpertsDown", 256, 0, "q4_k_m", 8) == "q6_k"
    assert P.tensor_type("ExpertsDown", 256, 1, "q4_k_m", 8) == "q4_k"
    assert P.tensor_type("ExpertsDown", 64, 1, "q4_k_m", 8) == "q8_0"
    assert P.tensor_type("AttnQ", 384, 1, "q4_k_m", 8) == "q8_0"
    assert P.tensor_type("f32", 512, 1, "q4_k_m", 8) == "f32"
    assert P.tensor_type("AttnQ", 48, 1, "q8_0", 8) == "f16"


def test_heldout_rule_reproduces_the_bundled_split():
    with open(LOG) as f:
        log = json.load(f)
    keys = log["data"]["heldout_keys"]
    assert len(keys) == log["data"]["heldout_files"]
    assert all(P.is_heldout(k) for k in keys)
    # The evaluation files: the first bundled model's 109 held-out files, kept so perplexities compare.
    evals = log["data"]["eval_keys"]
    assert len(evals) == 109 and set(evals) <= set(keys) and log["data"]["eval_same_tokens_as_bundled"]
    assert log["data"]["heldout_rule"] == "int(sha1('heldout:'+key)[:8], 16) % 100 < 2"


def test_gguf_tokenizer():
    tokens, merges, types = P.gguf_tokenizer(GGUF)
    assert len(tokens) == 8192 and len(merges) == 8185 - 256
    assert tokens[8185:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                             "</tool_call>"]
    assert types[8185] == 3 and types[8188] == 4 and types[0] == 1
    assert all(m.count(" ") == 1 for m in merges)


def test_schedule():
    peak, total, warm = 2e-3, 1000, 100
    assert P.lr_at(0, total, warm, peak) == peak / warm
    assert P.lr_at(99, total, warm, peak) == peak
    assert abs(P.lr_at(100, total, warm, peak) - peak) < 1e-12
    assert abs(P.lr_at(1000, total, warm, peak) - 0.1 * peak) < 1e-12
    lrs = [P.lr_at(s, total, warm, peak) for s in range(100, 1001)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    # The schedule is a function of the step alone: a resumed call continues it exactly.
    assert P.lr_at(537, total, warm, peak) == P.lr_at(537, total, warm, peak)
    assert P.total_steps_for(P.parse_count("300M"), 64, 512) == 9156
    assert P.parse_count("1.5G") == 1_500_000_000 and P.parse_count("120000") == 120000


def test_arguments():
    a = P.parse_args(["--out", "/tmp/x"])
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.lin_k_heads, a.lin_v_heads, a.experts, a.top_k, a.moe_ffn,
            a.shared_ffn, a.quant, a.mtp, a.max_params) == (256, 8, 4, 2, 2, 4, 32, 4, 64, 512, "bf16", 0, 27.0e6)
    a = P.parse_args(["--out", "/tmp/x", "--preset", "60m", "--layers", "12", "--ckpt", "/tmp/c", "--tokens", "100M"])
    assert (a.hidden, a.layers, a.quant, a.max_params) == (512, 12, "q4_k_m", float("inf"))
    for bad in (["--out", "/tmp/x", "--ckpt", "/tmp/c"], ["--out", "/tmp/x", "--resume"]):
        try:
            P.parse_args(bad)
        except SystemExit:
            continue
        raise AssertionError(f"accepted {bad}")
    assert P.parse_args(["--out", "/tmp/x", "--ckpt", "/tmp/c", "--resume"]).resume


def load_train_without_torch():
    """train.py with its heavy imports stubbed (torch, numpy, tokenizers, transformers exist only on the
    GPU machine), for its torch-free functions: packing and the run plan."""
    import importlib.util
    from unittest import mock
    stubs = {m: mock.MagicMock() for m in ("numpy", "torch", "torch.nn", "torch.nn.functional", "tokenizers",
                                            "transformers")}
    stubs["torch"].nn.Module = object
    with mock.patch.dict(sys.modules, stubs):
        spec = importlib.util.spec_from_file_location("train_stubbed", os.path.join(HERE, "train.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def test_pack_ships_what_fits_one_call():
    import tempfile
    T = load_train_without_torch()
    for mib, want_parts_out, want_staged in ((40, 3, 3), (130, 4, 9)):
        d = tempfile.mkdtemp()
        out = os.path.join(d, "run")
        os.makedirs(os.path.join(out, "hf"))
        with open(os.path.join(out, "hf", "model.safetensors"), "wb") as f:
            f.write(os.urandom(1 << 20) * mib)
        extras = []
        for n in ("summary.md", "train_log.json", "greedy_reference.json"):
            extras.append(os.path.join(out, n))
            with open(extras[-1], "w") as f:
                f.write("x" * 1000)
        pack = os.path.join(d, "OUT")
        T.pack_outputs(out, pack, extras)
        shipped = os.listdir(pack)
        assert len([n for n in shipped if ".tar.part" in n]) == want_parts_out, shipped
        assert len(os.listdir(out + ".parts")) == want_staged
        assert len(shipped) <= T.MAX_PACK_FILES - 1
        assert sum(os.path.getsize(os.path.join(pack, n)) for n in shipped) <= T.MAX_PACK_BYTES


def test_run_plan_is_fixed_at_the_first_call():
    import tempfile
    T = load_train_without_torch()
    d = tempfile.mkdtemp()
    a = T.parse_args(["--out", d + "/o1", "--ckpt", d + "/c", "--preset", "40m", "--tokens", "200M", "--mtp", "1"])
    plan = T.load_plan(a)
    assert plan["total_steps"] == 6104 and plan["warmup"] == 100
    b = T.parse_args(["--out", d + "/o2", "--ckpt", d + "/c", "--resume", "--lr", "1"])
    T.load_plan(b)
    assert (b.hidden, b.mtp, b.preset, b.lr, b.max_params) == (384, 1, "40m", 2e-3, float("inf"))
    try:
        T.load_plan(T.parse_args(["--out", d + "/o3", "--ckpt", d + "/c", "--tokens", "1M"]))
        raise AssertionError("a second first call was accepted")
    except SystemExit:
        pass
    c = T.parse_args(["--out", d + "/o4", "--ckpt", d + "/m", "--train-minutes", "18"])
    assert T.load_plan(c)["total_steps"] is None  # fixed at step 25 of that call


def test_short_docstrings_cut_to_the_first_line_and_keep_the_rest():
    import ast
    src = ('"""Module.\n\nMore.\n"""\nimport os\n\x0c\n\ndef f(x):\n    """\n    Return x.\n\n    Long.\n    """\n'
           '    return x  # keep\n\n\nclass C:\n    def g(self): """a\n    b"""; return 1\n'
           '    def h(self):\n        """Says \\"hi\\".\n        """\n        pass\n')
    out = P.short_docstrings(src)
    assert ast.dump(ast.parse(out)) != ast.dump(ast.parse(src))
    assert out.startswith('"""Module."""\nimport os\n\x0c\n')
    assert '    """Return x."""\n    return x  # keep\n' in out
    assert 'def g(self): """a\n    b"""; return 1' in out  # shares its line with code: kept
    assert 'Says \\"hi\\"' in out  # would need escaping: kept
    assert P.short_docstrings("def broken(:\n") == "def broken(:\n"
    shares = [P.short_docstrings_chosen(f"k{i}", 0.9) for i in range(2000)]
    assert 0.85 < sum(shares) / len(shares) < 0.95 and not P.short_docstrings_chosen("k1", 0.0)


def test_short_docstrings_all_equals_the_serial_pass():
    doc = 'def f():\n    """First line.\n\n    More.\n    """\n    return 1\n'
    files = [(f"k{i}", doc if i % 3 else "x = 1\n") for i in range(40)]
    out, changed = P.short_docstrings_all(files, 0.5, processes=2)
    serial = [(k, P.short_docstrings(t) if P.short_docstrings_chosen(k, 0.5) else t) for k, t in files]
    assert out == serial
    assert changed == sum(a != b for (_, a), (_, b) in zip(files, serial)) > 0


if __name__ == "__main__":
    import contextlib
    import io
    n = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            with contextlib.redirect_stderr(io.StringIO()):
                fn()
            print(f"ok {name}")
            n += 1
    print(f"{n} tests passed")

