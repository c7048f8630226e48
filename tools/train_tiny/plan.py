"""Torch-free parts of train.py: model presets, parameter counts, the expected GGUF size per quant,
the learning-rate schedule, the held-out rule and a minimal GGUF reader (to reuse the bundled model's
tokenizer and to check the size estimate against a real file). Runs with plain python3 (no numpy), so
it can be checked on machines without torch: `python3 tools/train_tiny/test_plan.py`.
"""

import argparse
import ast
import hashlib
import math
import re
import struct

# ----------------------------------------------------------------------------------------------------
# Presets
# ----------------------------------------------------------------------------------------------------

# Shape keys a preset sets (argparse dests of train.py). "22m" is the bundled model's shape (the
# defaults). The bigger ones keep what strata needs: [DeltaNet x3, full attention] blocks, gated
# attention, 32 routed experts top-4 plus a sigmoid-gated shared expert, vocab 8192 (same tokenizer).
# Sizes: python3 tools/train_tiny/plan.py (they include strata's F32 tensors and the vocabulary).
PRESETS = {
    "22m": dict(hidden=256, layers=8, heads=4, kv_heads=2, lin_k_heads=2, lin_v_heads=4, experts=32, top_k=4,
                moe_ffn=64, shared_ffn=512, quant="bf16"),
    # 37M parameters (41M with the MTP head), meant for Q8_0: 44.5 MB with the head.
    "40m": dict(hidden=384, layers=8, heads=6, kv_heads=2, lin_k_heads=3, lin_v_heads=6, experts=32, top_k=4,
                moe_ffn=64, shared_ffn=768, quant="q8_0"),
    # 54M parameters (61M with the MTP head), meant for Q4_K_M: 42.0 MB with the head. strata's Q4_K_M
    # mix keeps output.weight at Q6_K and expert down rows of 64 (not a multiple of Q4_K's 256) fall
    # back to Q8_0, so ~80M parameters would be ~55-60 MB, over the cap.
    "60m": dict(hidden=512, layers=8, heads=8, kv_heads=2, lin_k_heads=4, lin_v_heads=8, experts=32, top_k=4,
                moe_ffn=64, shared_ffn=1024, quant="q4_k_m"),
}
SHAPE_KEYS = ("hidden", "layers", "heads", "kv_heads", "lin_k_heads", "lin_v_heads", "experts", "top_k", "moe_ffn",
              "shared_ffn")
HEAD_DIM = 64          # full attention and DeltaNet head size (all presets)
CONV_KERNEL = 4
SIZE_CAP_BYTES = 48 * 1000 * 1000  # the repository file's cap (issue 25)


def layer_types(n_layers):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layers)]


# ----------------------------------------------------------------------------------------------------
# Tensors as strata's converter writes them (src/strata/convert/tensor_plan.cpp, type_policy.cpp)
# ----------------------------------------------------------------------------------------------------

# (name, role, ne0 = row length, n_rows, layer). Roles follow strata's TensorRole; "f32" marks tensors
# the type policy always keeps F32 (norms, 1-D, router, shared-expert gate, ssm a/dt/conv/alpha/beta).
def gguf_tensors(shape, vocab, mtp=0):
    E, V, D = shape["hidden"], vocab, HEAD_DIM
    H, Hkv = shape["heads"], shape["kv_heads"]
    Hk, Hv = shape["lin_k_heads"], shape["lin_v_heads"]
    X, F, S = shape["experts"], shape["moe_ffn"], shape["shared_ffn"]
    key_dim, value_dim = Hk * D, Hv * D
    conv_dim = 2 * key_dim + value_dim
    n = shape["layers"]
    out = [("token_embd", "TokenEmbd", E, V, -1), ("output_norm", "f32", E, 1, -1), ("output", "Output", E, V, -1)]

    def layer(il, full):
        t = [("attn_norm", "f32", E, 1, il)]
        if full:
            t += [("attn_q", "AttnQ", E, 2 * H * D, il), ("attn_k", "AttnK", E, Hkv * D, il),
                  ("attn_v", "AttnV", E, Hkv * D, il), ("attn_output", "AttnOut", H * D, E, il),
                  ("attn_q_norm", "f32", D, 1, il), ("attn_k_norm", "f32", D, 1, il)]
        else:
            t += [("attn_qkv", "AttnQkv", E, conv_dim, il), ("attn_gate", "AttnGate", E, value_dim, il),
                  ("ssm_beta", "f32", E, Hv, il), ("ssm_alpha", "f32", E, Hv, il),
                  ("ssm_conv1d", "f32", CONV_KERNEL, conv_dim, il), ("ssm_dt", "f32", Hv, 1, il),
                  ("ssm_a", "f32", Hv, 1, il), ("ssm_norm", "f32", D, 1, il), ("ssm_out", "SsmOut", value_dim, E, il)]
        t += [("post_attention_norm", "f32", E, 1, il), ("ffn_gate_inp", "f32", E, X, il),
              ("ffn_gate_exps", "ExpertsGate", E, F * X, il), ("ffn_up_exps", "ExpertsUp", E, F * X, il),
              ("ffn_down_exps", "ExpertsDown", F, E * X, il), ("ffn_gate_inp_shexp", "f32", E, 1, il),
              ("ffn_gate_shexp", "SharedGate", E, S, il), ("ffn_up_shexp", "SharedUp", E, S, il),
              ("ffn_down_shexp", "SharedDown", S, E, il)]
        return [(f"blk.{il}.{a}", b, c, d, e) for a, b, c, d, e in t]

    for il, lt in enumerate(layer_types(n)):
        out += layer(il, lt == "full_attention")
    for j in range(mtp):
        il = n + j
        out += [(f"blk.{il}.nextn.eh_proj", "MtpProj", 2 * E, E, il), (f"blk.{il}.nextn.enorm", "f32", E, 1, il),
                (f"blk.{il}.nextn.hnorm", "f32", E, 1, il), (f"blk.{il}.nextn.shared_head_norm", "f32", E, 1, il)]
        out += layer(il, True)
    return out


def count_params(shape, vocab, mtp=0):
    """Parameters of the HF model (plus the MTP head when mtp=1): same as the GGUF's elements."""
    return sum(ne0 * rows for _, _, ne0, rows, _ in gguf_tensors(shape, vocab, mtp))


def active_params(shape, vocab):
    """Parameters one token touches (top_k of the routed experts), embedding row excluded."""
    total = count_params(shape, vocab) - vocab * shape["hidden"]
    unused = shape["layers"] * 3 * shape["hidden"] * shape["moe_ffn"] * (shape["experts"] - shape["top_k"])
    return total - unused


# type name -> (block elements, bytes per block)
GGML_TYPES = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
              "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
QUANTS = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m")


def _more_bits_layer(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(role, ne0, layer, quant, n_layer):
    """strata's convert type policy: F32 for the always-F32 set, the q4_k_m mix, block fallbacks."""
    if role == "f32":
        return "f32"
    want = quant
    if quant == "q4_k_m":
        more = layer >= 0 and _more_bits_layer(layer, n_layer)
        if role == "Output":
            want = "q6_k"
        elif role in ("AttnV", "AttnQkv", "ExpertsDown", "SharedDown", "FfnDown"):
            want = "q6_k" if more else "q4_k"
        else:
            want = "q4_k"
    block = GGML_TYPES[want][0]
    if ne0 % block == 0:
        return want
    return "q8_0" if ne0 % 32 == 0 else "f16"


def tensor_nbytes(typ, ne0, rows):
    block, nb = GGML_TYPES[typ]
    return (ne0 // block) * nb * rows


# Bytes of the bundled file that are not tensor data or tensor infos: header and metadata, mostly the
# 8192-token vocabulary and its merges (measured on models/strata-tiny.gguf by test_plan.py; the
# tokenizer is the same for every preset).
GGUF_METADATA_BYTES = 264_000
GGUF_ALIGN = 32


def gguf_size(shape, vocab, quant, mtp=0, metadata_bytes=GGUF_METADATA_BYTES):
    """Expected file size of `strata convert --type <quant>` for this shape, and bytes per type."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r} (one of {', '.join(QUANTS)})")
    n_layer = shape["layers"]
    total, by_type = metadata_bytes, {}
    for name, role, ne0, rows, layer in gguf_tensors(shape, vocab, mtp):
        typ = tensor_type(role, ne0, layer, quant, n_layer)
        nb = tensor_nbytes(typ, ne0, rows)
        by_type[typ] = by_type.get(typ, 0) + nb
        ndims = 1 if rows == 1 else 2
        total += 8 + len(name) + 7 + 4 + 8 * ndims + 4 + 8  # tensor info (name + ".weight"), approx.
        total += (nb + GGUF_ALIGN - 1) // GGUF_ALIGN * GGUF_ALIGN
    return total, by_type


def describe(shape, vocab, quant, mtp=0):
    n = count_params(shape, vocab)
    size, by_type = gguf_size(shape, vocab, quant, mtp)
    line = (f"{n / 1e6:.2f}M parameters ({active_params(shape, vocab) / 1e6:.2f}M active a token)"
            + (f" + MTP head {(count_params(shape, vocab, mtp) - n) / 1e6:.2f}M" if mtp else "")
            + f"; GGUF at {quant}: {size / 1e6:.2f} MB ({size / 2**20:.2f} MiB)"
            + ("" if size <= SIZE_CAP_BYTES else f" -- OVER the {SIZE_CAP_BYTES / 1e6:.0f} MB cap")
            + " [" + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(by_type.items())) + "]")
    return line, size


# ----------------------------------------------------------------------------------------------------
# Schedule, split, steps
# ----------------------------------------------------------------------------------------------------

def lr_at(step, total, warmup, peak, floor_frac=0.1):
    """Linear warmup, then cosine decay to floor_frac * peak at `total` (constant when total is None)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if total is None:
        return peak
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def path_hash(key):
    return hashlib.sha1(key.encode("utf-8")).hexdigest()


def is_heldout(key, percent=2):
    """The bundled model's held-out rule (models/README.md): whole files, by a hash of their key."""
    return int(path_hash("heldout:" + key)[:8], 16) % 100 < percent


def short_docstrings_chosen(key, fraction):
    """Whether training file `key` gets short_docstrings (a fixed share of files, by a hash of the key)."""
    return int(path_hash("shortdoc:" + key)[:8], 16) % 10000 < round(fraction * 10000)


def short_docstrings(text):
    """The source with every multi-line docstring (module, class, function) cut to a one-line docstring
    of its first line, the rest of the text byte for byte. The site-packages this model learns from
    open most functions with long reference docstrings; a model of ~40M parameters then spends its
    tokens on prose. Docstrings that share a line with code, or whose first line would need escaping,
    are kept as they are; text that does not parse is returned unchanged."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text
    # Line ends as the parser counts them (str.splitlines also splits at form feeds and the like).
    lines = re.findall(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$", text)
    cuts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not node.body or not isinstance(node.body[0], ast.Expr):
            continue
        doc = node.body[0].value
        if not (isinstance(doc, ast.Constant) and isinstance(doc.value, str)):
            continue
        a, b = doc.lineno, doc.end_lineno
        if b is None or a == b:
            continue
        first, last = lines[a - 1], lines[b - 1]
        indent = first[:doc.col_offset]
        if indent.strip() or last[doc.end_col_offset:].strip():
            continue
        summary = next((ln.strip() for ln in doc.value.splitlines() if ln.strip()), "")
        if not summary or "\\" in summary or '"' in summary:
            continue
        eol = "\r\n" if last.endswith("\r\n") else "\n"
        cuts.append((a, b, f'{indent}"""{summary}"""{eol}'))
    for a, b, line in sorted(cuts, reverse=True):
        lines[a - 1:b] = [line]
    return "".join(lines)


def short_docstrings_item(item):
    """(key, text, fraction) -> (text after short_docstrings when the file is chosen, changed?), for a pool."""
    key, text, fraction = item
    if not short_docstrings_chosen(key, fraction):
        return text, False
    cut = short_docstrings(text)
    return cut, cut != text


def short_docstrings_all(files, fraction, processes=None):
    """short_docstrings over the chosen share of [(key, text)] files, in worker processes (the pass parses
    every file, the slowest part of preparing a large data set). Returns (files in order, files changed)."""
    import multiprocessing
    items = [(key, text, fraction) for key, text in files]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        out = pool.map(short_docstrings_item, items, chunksize=32)
    return [(key, text) for (key, _), (text, _) in zip(files, out)], sum(changed for _, changed in out)


def total_steps_for(tokens, batch, seq):
    return max(1, math.ceil(tokens / (batch * seq)))


def parse_count(s):
    """'300M', '1.5G', '120000' -> int."""
    s = str(s).strip().upper()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9}.get(s[-1:], None)
    return int(float(s[:-1]) * mult) if mult else int(float(s))


# ----------------------------------------------------------------------------------------------------
# Minimal GGUF reader (metadata and tensor infos; no tensor data)
# ----------------------------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 8: "q8_0", 12: "q4_k", 13: "q5_k", 14: "q6_k", 30: "bf16"}


def read_gguf(path, want_tensors=True):
    """Returns (metadata dict, tensor infos [(name, dims, type_id, offset)], data_start offset)."""
    with open(path, "rb") as f:
        buf = f.read(64 << 20)  # metadata and infos sit at the front; 64 MiB is far more than enough
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8", errors="surrogateescape")
        pos += n
        return s

    def value(t):
        if t in _SCALARS:
            return take(_SCALARS[t])
        if t == 8:
            return string()
        if t == 9:
            it, n = take("<I"), take("<Q")
            return [value(it) for _ in range(n)]
        raise ValueError(f"{path}: unknown GGUF value type {t}")

    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    version = take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {"__version__": version}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    if want_tensors:
        for _ in range(n_tensors):
            name = string()
            nd = take("<I")
            dims = [take("<Q") for _ in range(nd)]
            infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    data_start = (pos + align - 1) // align * align
    return meta, infos, data_start


def gguf_tokenizer(path):
    """The BPE vocabulary of a strata-converted GGUF: (tokens in id order, merges as 'a b' strings,
    token types). Token strings are the byte-level symbols of tokenizer.json."""
    meta, _, _ = read_gguf(path, want_tensors=False)
    return meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.merges", []), meta.get("tokenizer.ggml.token_type")


# ----------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------

# Settings that define a resumable run: fixed at its first call (plan.json), read back by --resume.
PLAN_KEYS = ("preset", "quant", "vocab") + SHAPE_KEYS + (
    "seq", "batch", "lr", "warmup", "weight_decay", "aux_coef", "seed", "data_mb", "tok_train_mb", "heldout_percent",
    "eval_windows", "mtp", "mtp_weight", "tokenizer_gguf", "short_docstrings")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="train a tiny qwen3_5_moe model on Python source")
    ap.add_argument("--out", required=True, help="output directory (created; must not exist or be empty)")
    ap.add_argument("--pack", default=None, help="also write <out>.tar split into 15 MiB parts here")
    ap.add_argument("--minutes", type=float, default=8.5, help="wall-clock budget for the WHOLE script")
    ap.add_argument("--reserve-s", type=float, default=50.0, help="seconds kept for eval/export after training")
    ap.add_argument("--steps", type=int, default=None, help="fix the number of training steps (without --ckpt)")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--data-mb", type=float, default=96.0, help="cap on source bytes read")
    ap.add_argument("--tok-train-mb", type=float, default=24.0, help="bytes used to train the tokenizer")
    ap.add_argument("--tokenizer-gguf", default=None,
                    help="take the tokenizer (tokens, merges) from this GGUF instead of training one, e.g. "
                         "models/strata-tiny.gguf: same ids as the bundled model")
    ap.add_argument("--heldout-percent", type=int, default=2)
    ap.add_argument("--short-docstrings", type=float, default=0.0,
                    help="share of training files (0..1, by key) whose docstrings are cut to one line (held-out untouched)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="model shape (22m = the defaults); single shape flags below override it")
    ap.add_argument("--quant", choices=QUANTS, default=None,
                    help="GGUF type the model is meant for (only for the size estimate; the preset's by default)")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None, help="full-attention query heads (of 64)")
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--lin-k-heads", type=int, default=None, help="DeltaNet key heads (of 64)")
    ap.add_argument("--lin-v-heads", type=int, default=None, help="DeltaNet value heads (of 64)")
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--moe-ffn", type=int, default=None)
    ap.add_argument("--shared-ffn", type=int, default=None)
    ap.add_argument("--aux-coef", type=float, default=1e-3, help="router load-balancing loss weight (0 = off)")
    ap.add_argument("--mtp", type=int, choices=(0, 1), default=0, help="train and export one MTP layer")
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="weight of the MTP loss (token t+2)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-params", type=float, default=None,
                    help="refuse configs above this (default 27e6 without --preset, no limit with one)")
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--ckpt", default=None, help="checkpoint folder: a run that spans several calls")
    ap.add_argument("--resume", action="store_true", help="continue the run in --ckpt (its settings are kept)")
    ap.add_argument("--total-steps", type=int, default=None, help="planned steps of a --ckpt run (first call)")
    ap.add_argument("--tokens", default=None, help="planned training tokens of a --ckpt run, e.g. 300M (first call)")
    ap.add_argument("--train-minutes", type=float, default=None,
                    help="planned training time of a --ckpt run, all calls together (first call): the total steps "
                         "are fixed from the step time measured at its step 25")
    ap.add_argument("--ckpt-every", type=int, default=250, help="save (and evaluate) every N steps")
    ap.add_argument("--fast", type=int, choices=(0, 1), default=0,
                    help="train with fast.py's forward (checked against the HF forward first; references stay HF's)")
    ap.add_argument("--compile", type=int, choices=(0, 1), default=0, help="torch.compile fast.py's forward")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="profile this many training steps (torch.profiler), print the top operations, exit")
    args = ap.parse_args(argv)
    base = PRESETS[args.preset or "22m"]
    for k in SHAPE_KEYS:
        if getattr(args, k) is None:
            setattr(args, k, base[k])
    if args.quant is None:
        args.quant = base["quant"]
    if args.max_params is None:
        args.max_params = 27.0e6 if args.preset is None else float("inf")
    if args.resume and not args.ckpt:
        ap.error("--resume needs --ckpt")
    if args.ckpt and not args.resume and args.total_steps is None and args.tokens is None and args.train_minutes is None:
        ap.error("a --ckpt run fixes its length at the first call: give --total-steps, --tokens or --train-minutes")
    return args


if __name__ == "__main__":
    # The expected GGUF size of every preset at every quant, with and without the MTP head.
    for name, p in PRESETS.items():
        shape = {k: p[k] for k in SHAPE_KEYS}
        print(f"{name} (meant for {p['quant']}): {shape}")
        for q in ("bf16", "q8_0", "q4_k_m"):
            for mtp in (0, 1):
                print(f"  {q:7s} mtp={mtp}: {describe(shape, 8192, q, mtp)[0]}")
