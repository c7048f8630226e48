"""The DFlash block drafter of src/strata/engine/dflash.h in torch: training forward (many blocks of a
sequence at once, each its own context), the one-block inference strata runs, and the GGUF export
strata loads (architecture "dflash"). The equations are the header's; test_dflash_torch.py checks the
inference path against a float64 reference of them and the training path against the inference path.

Shapes: d = the target's hidden size; taps [batch, seq, L * d] are the target's residual stream after
each of `target_layers` (L of them); the target's embedding and output matrix are passed in (frozen).
"""

import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

import plan


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, rot, base):
    """NEOX rotary on the first `rot` dims of the last axis: pairs (i, i + rot/2), angle pos * base^(-2i/rot).
    x [..., positions, heads, hd], pos [..., positions] (broadcast over heads)."""
    if rot == 0:
        return x
    half = rot // 2
    inv = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2.0 / rot)
    ang = (pos.to(torch.float64).unsqueeze(-1) * inv).to(x.dtype).unsqueeze(-2)  # [..., positions, 1, half]
    cos, sin = ang.cos(), ang.sin()
    x1, x2, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest), -1)


class Layer(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, hd, ff):
        super().__init__()
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.q_norm = torch.nn.Parameter(torch.ones(hd))
        self.k_norm = torch.nn.Parameter(torch.ones(hd))
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.wq = torch.nn.Linear(d, heads * hd, bias=False)
        self.wk = torch.nn.Linear(d, kv_heads * hd, bias=False)
        self.wv = torch.nn.Linear(d, kv_heads * hd, bias=False)
        self.wo = torch.nn.Linear(heads * hd, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)


class DFlash(torch.nn.Module):
    def __init__(self, d, target_layers, n_layer=2, heads=6, kv_heads=2, hd=64, ff=1024, block=8, rope_dims=32,
                 rope_base=10000.0, eps=1e-6, vocab=0, context=0):
        super().__init__()
        # context: the most recent context rows a block sees (0: all), as dflash.context_length.
        self.cfg = dict(d=d, target_layers=list(target_layers), n_layer=n_layer, heads=heads, kv_heads=kv_heads, hd=hd,
                        ff=ff, block=block, rope_dims=rope_dims, rope_base=rope_base, eps=eps, vocab=vocab,
                        context=context)
        self.fc = torch.nn.Linear(d * len(target_layers), d, bias=False)
        self.hidden_norm = torch.nn.Parameter(torch.ones(d))
        self.mask = torch.nn.Parameter(torch.randn(d) * 0.02)
        self.output_norm = torch.nn.Parameter(torch.ones(d))
        self.layers = torch.nn.ModuleList([Layer(d, heads, kv_heads, hd, ff) for _ in range(n_layer)])
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, 0.0, 0.02)

    def heads(self, x, n, w, pos):
        """[..., P, n * hd] -> per-head rms with w, rotary at pos: [..., P, n, hd]."""
        c = self.cfg
        x = x.view(*x.shape[:-1], n, c["hd"])
        return rope(rms(x, w, c["eps"]), pos, c["rope_dims"], c["rope_base"])

    def context(self, taps):
        c = self.cfg
        return rms(self.fc(taps), self.hidden_norm, c["eps"])

    def blocks(self, feats, ctx_pos, blk_x, blk_pos, allowed):
        """Runs blocks against their contexts. feats [b, S, d] context features at ctx_pos [b, S]; blk_x
        [b, Q, d] the block rows (Q = blocks x block size) at blk_pos [b, Q]; allowed [b, Q, S + Q] bool:
        which keys (context rows, then block rows) each block row sees. Returns the final normed rows [b, Q, d]."""
        c = self.cfg
        x = blk_x
        rep = c["heads"] // c["kv_heads"]
        for L in self.layers:
            h = rms(x, L.attn_norm, c["eps"])
            q = self.heads(L.wq(h), c["heads"], L.q_norm, blk_pos)
            k = torch.cat((self.heads(L.wk(feats), c["kv_heads"], L.k_norm, ctx_pos),
                           self.heads(L.wk(h), c["kv_heads"], L.k_norm, blk_pos)), 1)
            v = torch.cat((L.wv(feats), L.wv(h)), 1).view(*k.shape)
            k, v = (t.repeat_interleave(rep, dim=2).transpose(1, 2) for t in (k, v))  # [b, heads, keys, hd]
            s = (q.transpose(1, 2) @ k.transpose(-1, -2)) / math.sqrt(c["hd"])
            s = s.masked_fill(~allowed.unsqueeze(1), float("-inf"))
            wide = s.float() if s.dtype in (torch.float16, torch.bfloat16) else s  # softmax at least in float32
            o = (torch.softmax(wide, -1).to(v.dtype) @ v).transpose(1, 2).reshape(*x.shape[:-1], -1)
            x = x + L.wo(o)
            g = rms(x, L.ffn_norm, c["eps"])
            x = x + L.down(F.silu(L.gate(g)) * L.up(g))
        return rms(x, self.output_norm, c["eps"])

    def train_rows(self, taps, ids, anchors, embed):
        """Training: taps [b, S, L*d], ids [b, S], anchors [b, M] (each < S - block + 1). Block m of
        sequence i starts at anchors[i, m] with the token there, masks after it, and sees the context
        positions before its anchor and its own block. Returns the normed rows of block positions 1.. and
        their target ids: [b, M, block - 1, d], [b, M, block - 1]."""
        c = self.cfg
        b, S = ids.shape
        M, B = anchors.shape[1], c["block"]
        dev = ids.device
        feats = self.context(taps)
        ctx_pos = torch.arange(S, device=dev).expand(b, S)
        j = torch.arange(B, device=dev)
        blk_pos = (anchors.unsqueeze(-1) + j).reshape(b, M * B)
        first = embed(torch.gather(ids, 1, anchors))  # [b, M, d]
        blk_x = torch.cat((first.unsqueeze(2), self.mask.to(first.dtype).expand(b, M, B - 1, -1)), 2).reshape(b, M * B, -1)
        anchor_of_row = anchors.repeat_interleave(B, 1).unsqueeze(-1)  # [b, M*B, 1]
        see_ctx = ctx_pos.unsqueeze(1) < anchor_of_row  # [b, M*B, S]
        if c["context"] > 0:
            see_ctx &= ctx_pos.unsqueeze(1) >= anchor_of_row - c["context"]
        blk_of = torch.arange(M * B, device=dev) // B
        see_blk = (blk_of.unsqueeze(0) == blk_of.unsqueeze(1)).expand(b, -1, -1)
        out = self.blocks(feats, ctx_pos, blk_x, blk_pos, torch.cat((see_ctx, see_blk), -1))
        labels = torch.gather(ids, 1, (anchors.unsqueeze(-1) + j[1:]).reshape(b, -1)).view(b, M, B - 1)
        return out.view(b, M, B, -1)[:, :, 1:], labels

    @torch.no_grad()
    def draft(self, taps, anchor, embed, output):
        """Inference as strata runs it: taps [n, L*d] of context positions 0..n-1 (the last `context` of them
        seen), the anchor token at n. Returns logits [block - 1, vocab] (row j-1: the token at n + j)."""
        c = self.cfg
        n, B = taps.shape[0], c["block"]
        dev = taps.device
        first = max(0, n - c["context"]) if c["context"] > 0 else 0
        feats = self.context(taps[first:].unsqueeze(0))
        blk_x = torch.cat((embed(torch.tensor([[anchor]], device=dev)),
                           self.mask.to(feats.dtype).expand(1, B - 1, -1)), 1)
        allowed = torch.ones(1, B, n - first + B, dtype=torch.bool, device=dev)
        out = self.blocks(feats, torch.arange(first, n, device=dev).unsqueeze(0), blk_x,
                          (n + torch.arange(B, device=dev)).unsqueeze(0), allowed)
        return output(out[0, 1:])


def block_weights(block, gamma=None):
    """Loss weight of block position j = 1..block-1: exp(-(j - 1) / gamma), gamma = block / 2 by default
    (the first drafts matter most: a tree is only as deep as its first rejection)."""
    gamma = gamma or block / 2.0
    return torch.tensor([math.exp(-(j - 1) / gamma) for j in range(1, block)])


# ---- GGUF export ------------------------------------------------------------------------------------

def _gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _gguf_kv(key, value):
    out = _gguf_string(key)
    if isinstance(value, str):
        return out + struct.pack("<I", 8) + _gguf_string(value)
    if isinstance(value, float):
        return out + struct.pack("<If", 6, value)
    if isinstance(value, (list, tuple)):
        return out + struct.pack("<IIQ", 9, 5, len(value)) + b"".join(struct.pack("<i", int(v)) for v in value)
    return out + struct.pack("<IQ", 10, int(value))  # uint64


GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8


def q8_0_bytes(a):
    """GGML Q8_0 of a float array whose rows are multiples of 32 long: per block of 32, a float16 scale
    d = max|x| / 127 and 32 int8 values round(x / d)."""
    b = np.asarray(a, dtype=np.float32).reshape(-1, 32)
    d16 = (np.abs(b).max(axis=1) / np.float32(127.0)).astype(np.float16)
    d = d16.astype(np.float32)  # codes against the stored scale, as strata's quantizer chooses them
    inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d > 0)
    out = np.empty(len(b), dtype=[("d", "<f2"), ("q", "i1", 32)])
    out["d"] = d16
    out["q"] = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    return out.tobytes()


def q8_0_values(raw, n):
    """The n floats of Q8_0 bytes."""
    blocks = np.frombuffer(raw, dtype=[("d", "<f2"), ("q", "i1", 32)], count=n // 32)
    return (blocks["q"].astype(np.float32) * blocks["d"].astype(np.float32)[:, None]).reshape(-1)


def stored_type(shape):
    """What the export stores a tensor as: matrices whose rows are multiples of 32 Q8_0 (other matrices
    F16), vectors F32."""
    if len(shape) != 2:
        return GGML_F32
    return GGML_Q8_0 if shape[-1] % 32 == 0 else GGML_F16


def as_exported(w):
    """A weight tensor rounded as the export stores it (for references computed on the shipped weights)."""
    a = w.detach().float().cpu().numpy()
    kind = stored_type(a.shape)
    if kind == GGML_Q8_0:
        a = q8_0_values(q8_0_bytes(a), a.size).reshape(a.shape)
    elif kind == GGML_F16:
        a = a.astype(np.float16).astype(np.float32)
    return torch.from_numpy(a).to(w.device, w.dtype)


def write_gguf(path, meta, tensors):
    """GGUF v3, 32-byte aligned; tensors: (name, float array [out, in] or [n]) stored as stored_type says.
    A matrix [out, in] is GGUF [in, out] (ne0 = in, the contiguous row)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head += b"".join(_gguf_kv(k, v) for k, v in meta.items())
    blobs, offset = [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(a, dtype=np.float32)
        kind = stored_type(a.shape)
        data = (q8_0_bytes(a) if kind == GGML_Q8_0 else a.astype("<f2" if kind == GGML_F16 else "<f4").tobytes())
        ne = list(reversed(a.shape))
        head += _gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        head += struct.pack("<IQ", kind, offset)
        blobs.append(data)
        offset += len(data)
        pad = (-offset) % 32
        blobs.append(b"\0" * pad)
        offset += pad
    with open(path, "wb") as f:
        f.write(head)
        f.write(b"\0" * ((-len(head)) % 32))
        for blob in blobs:
            f.write(blob)


def read_gguf(path):
    """The metadata and float tensors of a file write_gguf wrote: (meta, [(name, array [out, in] or [n])])."""
    meta, infos, data_start = plan.read_gguf(path)
    meta.pop("__version__", None)  # plan's, not a key of the file
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    tensors = []
    for name, ne, kind, off in infos:
        shape, n = list(reversed(ne)), int(np.prod(ne))
        raw = buf[data_start + off:]
        if kind == GGML_Q8_0:
            a = q8_0_values(raw, n)
        elif kind in (GGML_F16, GGML_F32):
            a = np.frombuffer(raw, dtype="<f2" if kind == GGML_F16 else "<f4", count=n).astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has type {kind}, not one write_gguf writes")
        tensors.append((name, a.reshape(shape)))
    return meta, tensors


def export_gguf(model, path, extra=None):
    """Writes the drafter as strata loads it: matrices Q8_0 (stored_type), norms and the mask F32."""
    c = model.cfg
    meta = {"general.architecture": "dflash", "general.name": "strata DFlash drafter",
            "dflash.embedding_length": c["d"], "dflash.block_count": c["n_layer"],
            "dflash.attention.head_count": c["heads"], "dflash.attention.head_count_kv": c["kv_heads"],
            "dflash.attention.key_length": c["hd"], "dflash.attention.layer_norm_rms_epsilon": float(c["eps"]),
            "dflash.feed_forward_length": c["ff"], "dflash.block_size": c["block"],
            "dflash.rope.dimension_count": c["rope_dims"], "dflash.rope.freq_base": float(c["rope_base"]),
            "dflash.vocab_size": c["vocab"], "dflash.target_layers": c["target_layers"],
            "dflash.context_length": c["context"]}
    meta.update(extra or {})
    tensors = [("fc.weight", model.fc.weight), ("hidden_norm.weight", model.hidden_norm),
               ("mask_embd.weight", model.mask), ("output_norm.weight", model.output_norm)]
    for i, L in enumerate(model.layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", L.attn_norm), (b + "attn_q_norm.weight", L.q_norm),
                    (b + "attn_k_norm.weight", L.k_norm), (b + "ffn_norm.weight", L.ffn_norm),
                    (b + "attn_q.weight", L.wq.weight), (b + "attn_k.weight", L.wk.weight),
                    (b + "attn_v.weight", L.wv.weight), (b + "attn_output.weight", L.wo.weight),
                    (b + "ffn_gate.weight", L.gate.weight), (b + "ffn_up.weight", L.up.weight),
                    (b + "ffn_down.weight", L.down.weight)]
    write_gguf(path, meta, [(n, t.detach().float().cpu().numpy()) for n, t in tensors])
