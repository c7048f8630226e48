"""Rebuilds a Hugging Face checkpoint of a qwen35moe GGUF that `strata convert` wrote (the bundled model):
the trunk as Qwen3_5MoeForCausalLM, without its MTP layer, for training a drafter against it when
train.py's own checkpoint is gone. It inverts the converter's tensor plan (src/strata/convert/
tensor_plan.cpp, head_order.h): GGUF names back to HF names, the DeltaNet value heads back to HF's
order (rows of in_proj_qkv / in_proj_z / in_proj_b / in_proj_a / conv1d, columns of out_proj, dt_bias
and A_log), zero-centred RMSNorm weights back (w - 1), A back to A_log = log(-A), the experts back into
the fused gate_up_proj / down_proj. Q8_0 matrices are dequantised, so the checkpoint is the model strata
runs (its rounding included).

Run (GPU machine; needs torch and transformers):
    python3 tools/train_tiny/gguf_to_hf.py --gguf models/strata-tiny.gguf \\
        --config models/strata-tiny.hf-config.json --out DIR [--check-data CKPT_DIR]
--check-data: the held-out loss of the rebuilt model on train.py's held-out stream (a wrong inversion
shows as a loss far above the model's own, models/README.md).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan as P  # noqa: E402


def dequantise(raw, type_id, n):
    if type_id == 0:
        return np.frombuffer(raw, dtype="<f4", count=n).astype(np.float32)
    if type_id == 1:
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
    if type_id == 8:  # Q8_0: blocks of an f16 scale and 32 int8 codes
        blocks = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 34).reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    raise SystemExit(f"GGUF type {type_id} is not read here (f32, f16, q8_0)")


def read_tensors(path):
    """{name: float32 array shaped as numpy sees GGML's ne reversed (ne[0] last)}, and the metadata."""
    meta, infos, start = P.read_gguf(path)
    sizes = {0: lambda n: 4 * n, 1: lambda n: 2 * n, 8: lambda n: n // 32 * 34}
    out = {}
    with open(path, "rb") as f:
        for name, dims, type_id, offset in infos:
            n = int(np.prod(dims))
            if type_id not in sizes:
                raise SystemExit(f"{name}: GGUF type {type_id} is not read here (f32, f16, q8_0)")
            f.seek(start + offset)
            out[name] = dequantise(f.read(sizes[type_id](n)), type_id, n).reshape(list(reversed(dims)))
    return meta, out


def hf_head_for_gguf_position(p, n_k, n_v):
    r = n_v // n_k
    return (p % n_k) * r + p // n_k


def hf_index(i, head_len, n_k, n_v):
    return hf_head_for_gguf_position(i // head_len, n_k, n_v) * head_len + i % head_len


def rebuild(gguf, cfg):
    """The HF state dict (torch-free: numpy arrays) of the trunk."""
    _, tensors = read_tensors(gguf)
    used = set()

    class Take(dict):
        def __getitem__(self, k):
            used.add(k)
            return dict.__getitem__(self, k)

    t = Take(tensors)
    E, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    key_dim, value_dim = Hk * dk, Hv * dv
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"] - 1.0}
    if not cfg.get("tie_word_embeddings", False):
        sd["lm_head.weight"] = t["output.weight"]

    def unrow(a, untouched, head_len):
        """GGUF row r came from HF row untouched + hf_index(r - untouched): put it back."""
        src = np.array([r if r < untouched else untouched + hf_index(r - untouched, head_len, Hk, Hv)
                        for r in range(a.shape[0])])
        out = np.empty_like(a)
        out[src] = a
        return out

    head_perm = np.array([hf_head_for_gguf_position(p, Hk, Hv) for p in range(Hv)])
    col_perm = np.array([hf_index(c, dv, Hk, Hv) for c in range(value_dim)])
    for il, kind in enumerate(cfg["layer_types"][:L]):
        b, h = f"blk.{il}.", f"model.layers.{il}."
        sd[h + "input_layernorm.weight"] = t[b + "attn_norm.weight"] - 1.0
        sd[h + "post_attention_layernorm.weight"] = t[b + "post_attention_norm.weight"] - 1.0
        if kind == "full_attention":
            for g, n in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                sd[h + f"self_attn.{n}.weight"] = t[b + g + ".weight"]
            sd[h + "self_attn.q_norm.weight"] = t[b + "attn_q_norm.weight"] - 1.0
            sd[h + "self_attn.k_norm.weight"] = t[b + "attn_k_norm.weight"] - 1.0
        else:
            a = h + "linear_attn."
            sd[a + "in_proj_qkv.weight"] = unrow(t[b + "attn_qkv.weight"], 2 * key_dim, dv)
            sd[a + "in_proj_z.weight"] = unrow(t[b + "attn_gate.weight"], 0, dv)
            sd[a + "in_proj_b.weight"] = unrow(t[b + "ssm_beta.weight"], 0, 1)
            sd[a + "in_proj_a.weight"] = unrow(t[b + "ssm_alpha.weight"], 0, 1)
            conv = unrow(t[b + "ssm_conv1d.weight"], 2 * key_dim, dv)  # [channels, K]
            sd[a + "conv1d.weight"] = conv.reshape(conv.shape[0], 1, conv.shape[1])
            dt = np.empty(Hv, np.float32)
            dt[head_perm] = t[b + "ssm_dt.bias"]
            sd[a + "dt_bias"] = dt
            a_log = np.empty(Hv, np.float32)
            a_log[head_perm] = np.log(-t[b + "ssm_a"].astype(np.float64)).astype(np.float32)
            sd[a + "A_log"] = a_log
            sd[a + "norm.weight"] = t[b + "ssm_norm.weight"]
            out = np.empty_like(t[b + "ssm_out.weight"])
            out[:, col_perm] = t[b + "ssm_out.weight"]
            sd[a + "out_proj.weight"] = out
        m = h + "mlp."
        sd[m + "gate.weight"] = t[b + "ffn_gate_inp.weight"]
        gate, up = t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]  # [X, F, E]
        sd[m + "experts.gate_up_proj"] = np.concatenate((gate, up), axis=1)
        sd[m + "experts.down_proj"] = t[b + "ffn_down_exps.weight"]  # [X, E, F]
        sd[m + "shared_expert_gate.weight"] = t[b + "ffn_gate_inp_shexp.weight"].reshape(1, E)
        for g, n in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"), ("ffn_down_shexp", "down_proj")):
            sd[m + f"shared_expert.{n}.weight"] = t[b + g + ".weight"]
    # Everything but the MTP blocks (blk.L.. after the trunk's L layers) must have found its place.
    left = sorted(k for k in tensors if k not in used and not any(k.startswith(f"blk.{i}.") for i in range(L, L + 8)))
    if left:
        raise SystemExit(f"{gguf}: tensors this inversion does not place: {left[:8]} ({len(left)})")
    return sd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--config", required=True, help="the model's HF config.json (models/strata-tiny.hf-config.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--check-data", default=None, help="train.py's checkpoint folder (held.bin): held-out loss")
    args = ap.parse_args()
    write_checkpoint(args.gguf, args.config, args.out)
    if args.check_data:
        print(f"held-out loss of the rebuilt model: {held_out_loss(args.out, args.check_data):.4f}", flush=True)


def write_checkpoint(gguf, config, out):
    import torch
    from transformers import Qwen3_5MoeForCausalLM

    if not os.path.exists(config):
        raise SystemExit(f"{config}: no HF config for {gguf} (the model's config.json, e.g. models/strata-tiny.hf-config.json)")
    with open(config) as f:
        cfg = json.load(f)
    sd = rebuild(gguf, cfg)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeForCausalLM.config_class.from_dict(cfg))
    want = model.state_dict()
    missing = sorted(k for k in set(want) - set(sd) if not k.startswith("mtp."))
    extra = sorted(set(sd) - set(want))
    if missing or extra:
        raise SystemExit(f"state dict mismatch: missing {missing[:8]} ({len(missing)}), unexpected {extra[:8]} ({len(extra)})")
    for k, v in sd.items():
        if tuple(want[k].shape) != v.shape:
            raise SystemExit(f"{k}: HF shape {tuple(want[k].shape)}, rebuilt {v.shape}")
    mtp = [k for k in want if k.startswith("mtp.")]
    if mtp:
        print(f"note: the {len(mtp)} mtp.* tensors of the HF class are not rebuilt (left at their initial values)")
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    print(f"wrote {out}: {sum(v.size for v in sd.values()) / 1e6:.2f}M parameters from {gguf}", flush=True)


def held_out_loss(hf_dir, data_dir, windows=16, seq=512):
    """Mean next-token loss of the checkpoint in hf_dir on the first windows of train.py's held.bin."""
    import torch
    from transformers import Qwen3_5MoeForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = Qwen3_5MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(dev).eval()
    held = np.fromfile(os.path.join(data_dir, "held.bin"), dtype=np.int32)
    n = min(windows, (len(held) - 1) // seq)
    x = torch.from_numpy(held[: n * seq].astype(np.int64).reshape(n, seq)).to(dev)
    with torch.no_grad():
        lg = model(x).logits.float()
    return float(torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1)))


if __name__ == "__main__":
    main()
