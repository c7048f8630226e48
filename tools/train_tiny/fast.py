"""A faster training forward for train.py's Qwen3.5-MoE text model, over the HF model's own parameters.

transformers' forward spends most of a training step on launch overhead: a loop over experts with
host synchronisations, many small element-wise kernels. This forward computes the same function
with fewer, larger kernels:
- routed experts densely: one matmul for every expert's gate/up projection and one for every down
  projection, each expert's activations scaled by its routing weight (0 for experts a token did not
  pick, so the output and every gradient equal the sparse computation's);
- gated DeltaNet in chunks whose unit-triangular systems are solved in one call per chunk set
  (derivation in `gated_delta_chunked`);
- causal attention through scaled_dot_product_attention.

It reads the parameters of the HF modules in place (same tensors, same names), so the optimizer,
checkpoints and the export are those of the HF model. train.py checks it against the HF forward
(logits, loss and gradients, float32) before it trains with it; references are always the HF model's.
"""

import torch
import torch.nn.functional as F


def wide(t):
    """float32, or float64 when given (the tests' references are float64)."""
    return t if t.dtype == torch.float64 else t.float()


def rms_norm(x, weight, eps):
    """Qwen3.5's zero-centred RMSNorm: computed in float32, scaled by (1 + weight), cast back."""
    xf = wide(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + wide(weight))).type_as(x)


def gated_rms_norm(x, gate, weight, eps):
    """The DeltaNet output norm: RMSNorm (plain weight) per head, times silu(gate)."""
    dtype = x.dtype
    xf = wide(x)
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return ((weight * y) * F.silu(wide(gate))).to(dtype)


def rotate(x, cos, sin):
    """Rotary embedding on the first cos.shape[-1] dims of x [B, heads, S, D] (halves rotated)."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    return torch.cat((xr * cos + torch.cat((-x2, x1), -1) * sin, xp), -1)


def l2_normalise(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_chunked(q, k, v, g, beta, chunk=64):
    """Gated delta rule over a whole sequence from a zero state; q, k [B, S, Hk, Dk], v [B, S, Hv, Dv],
    g (log decay, <= 0) and beta [B, S, Hv]. Returns [B, S, Hv, Dv] in q's dtype.

    The recurrence (per head, state M of Dk x Dv): M <- M * exp(g_t); d_t = beta_t (v_t - M^T k_t);
    M <- M + k_t d_t^T; o_t = M^T q_t, with q and k L2-normalised and q scaled by Dk^-1/2.
    In a chunk starting from state M0, with G_i the cumulative log decay up to row i:
      d_i + sum_{j<i} beta_i e^(G_i - G_j) (k_i . k_j) d_j = beta_i v_i - beta_i e^(G_i) M0^T k_i,
    a unit lower-triangular system (I + A) d = rhs. So d = U - W M0 with U = (I + A)^-1 (beta v) and
    W = (I + A)^-1 (beta e^G k), both for every chunk at once; then, chunk by chunk,
      o_i = e^(G_i) M0^T q_i + sum_{j<=i} e^(G_i - G_j) (q_i . k_j) d_j,
      M_end = e^(G_last) M0 + sum_j e^(G_last - G_j) k_j d_j^T."""
    dtype = q.dtype
    B, S, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    if hk != hv:
        q, k = (t.repeat_interleave(hv // hk, dim=2) for t in (q, k))
    q, k, v = (wide(t.transpose(1, 2)) for t in (q, k, v))  # [B, H, S, D]
    g, beta = (wide(t.transpose(1, 2)) for t in (g, beta))  # [B, H, S]
    q = l2_normalise(q) * dk ** -0.5
    k = l2_normalise(k)
    pad = (-S) % chunk  # padded rows (g = 0, beta = 0) come after every real row: they change nothing
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n = (S + pad) // chunk
    q, k, v = (t.reshape(B, hv, n, chunk, -1) for t in (q, k, v))
    g, beta = (t.reshape(B, hv, n, chunk) for t in (g, beta))
    G = g.cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()  # e^(G_i - G_j), j <= i
    kb = k * beta.unsqueeze(-1)
    A = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)
    UW = torch.linalg.solve_triangular(A, torch.cat((v * beta.unsqueeze(-1), kb * G.exp().unsqueeze(-1)), -1),
                                       upper=False, unitriangular=True)  # one solve for both right-hand sides
    U, W = UW[..., :dv], UW[..., dv:]
    qk = (q @ k.transpose(-1, -2)) * decay
    qg = q * G.exp().unsqueeze(-1)
    last = G[..., -1:]
    kd = k * (last - G).exp().unsqueeze(-1)
    keep = last.exp().unsqueeze(-1)  # [B, H, n, 1, 1]
    state = q.new_zeros(B, hv, dk, dv)
    outs = []
    for c in range(n):
        d = U[:, :, c] - W[:, :, c] @ state
        outs.append(qg[:, :, c] @ state + qk[:, :, c] @ d)
        state = state * keep[:, :, c] + kd[:, :, c].transpose(-1, -2) @ d
    o = torch.stack(outs, 2).reshape(B, hv, n * chunk, dv)[:, :, :S]
    return o.transpose(1, 2).to(dtype)


def deltanet(mod, x):
    """Qwen3.5's gated DeltaNet token mixer (module `linear_attn`) on x [B, S, hidden]."""
    B, S, _ = x.shape
    qkv = mod.in_proj_qkv(x).transpose(1, 2)
    w = mod.conv1d.weight
    qkv = F.conv1d(qkv.to(w.dtype), w, mod.conv1d.bias, padding=w.shape[-1] - 1, groups=qkv.shape[1])[..., :S]
    qkv = F.silu(qkv).transpose(1, 2)
    q, k, v = torch.split(qkv, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
    q = q.reshape(B, S, -1, mod.head_k_dim)
    k = k.reshape(B, S, -1, mod.head_k_dim)
    v = v.reshape(B, S, -1, mod.head_v_dim)
    z = mod.in_proj_z(x).reshape(B, S, -1, mod.head_v_dim)
    beta = mod.in_proj_b(x).sigmoid()
    g = -mod.A_log.float().exp() * F.softplus(mod.in_proj_a(x).float() + mod.dt_bias)
    o = gated_delta_chunked(q, k, v, g, beta)
    eps = getattr(mod.norm, "variance_epsilon", getattr(mod.norm, "eps", 1e-6))
    o = gated_rms_norm(o, z, mod.norm.weight, eps)
    return mod.out_proj(o.reshape(B, S, -1))


def attention(mod, x, cos, sin):
    """Qwen3.5's gated full attention (module `self_attn`): per-head q/k norms, partial rotary, causal
    attention over key/value head groups, output times sigmoid(gate)."""
    B, S, _ = x.shape
    d = mod.head_dim
    q, gate = torch.chunk(mod.q_proj(x).view(B, S, -1, 2 * d), 2, dim=-1)
    gate = gate.reshape(B, S, -1)
    q = rms_norm(q, mod.q_norm.weight, mod.q_norm.eps).transpose(1, 2)
    k = rms_norm(mod.k_proj(x).view(B, S, -1, d), mod.k_norm.weight, mod.k_norm.eps).transpose(1, 2)
    v = mod.v_proj(x).view(B, S, -1, d).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=mod.scaling,
                                       enable_gqa=q.shape[1] != k.shape[1])
    o = o.transpose(1, 2).reshape(B, S, -1) * torch.sigmoid(gate)
    return mod.o_proj(o)


def moe(mlp, x):
    """The sparse MoE block (top-k softmax router with renormalised weights, routed experts, sigmoid-
    gated shared expert) computed densely over experts. Returns (output, router logits [N, E])."""
    shape = x.shape
    xf = x.reshape(-1, shape[-1])
    n, hidden = xf.shape
    logits = F.linear(xf, mlp.gate.weight)
    probs = torch.softmax(wide(logits), dim=-1)
    top_w, top_i = torch.topk(probs, mlp.gate.top_k, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)).to(logits.dtype)
    ex = mlp.experts
    e, f2, _ = ex.gate_up_proj.shape
    f = f2 // 2
    weights = torch.zeros(n, e, dtype=top_w.dtype, device=xf.device).scatter(1, top_i, top_w)
    gu = F.linear(xf, ex.gate_up_proj.reshape(e * f2, hidden)).view(n, e, f2)
    act = F.silu(gu[..., :f]) * gu[..., f:] * weights.unsqueeze(-1).to(gu.dtype)
    routed = F.linear(act.reshape(n, e * f), ex.down_proj.permute(1, 0, 2).reshape(hidden, e * f))
    sh = mlp.shared_expert
    shared = sh.down_proj(F.silu(sh.gate_proj(xf)) * sh.up_proj(xf))
    out = routed + torch.sigmoid(mlp.shared_expert_gate(xf)) * shared
    return out.reshape(shape), logits


def decoder_layer(layer, x, cos, sin):
    eps = layer.input_layernorm.eps
    h = rms_norm(x, layer.input_layernorm.weight, eps)
    h = deltanet(layer.linear_attn, h) if hasattr(layer, "linear_attn") else attention(layer.self_attn, h, cos, sin)
    x = x + h
    m, logits = moe(layer.mlp, rms_norm(x, layer.post_attention_layernorm.weight, eps))
    return x + m, logits


def taps(model, ids, cos, sin, layers):
    """The residual stream after each of `layers` ([B, S, len(layers) * hidden], in that order): what
    strata's HiddenRecord with layers holds, a DFlash drafter's context. Stops after the last one."""
    x = model.model.embed_tokens(ids)
    out = {}
    for i, layer in enumerate(model.model.layers[:max(layers) + 1]):
        x, _ = decoder_layer(layer, x, cos, sin)
        if i in layers:
            out[i] = x
    return torch.cat([out[i] for i in layers], -1)


def trunk(model, ids, cos, sin):
    """The text model: returns (final hidden after the output norm, logits, router logits per layer)."""
    x = model.model.embed_tokens(ids)
    router = []
    for layer in model.model.layers:
        x, r = decoder_layer(layer, x, cos, sin)
        router.append(r)
    norm = model.model.norm
    h = rms_norm(x, norm.weight, norm.eps)
    return h, model.lm_head(h), router


def mtp_logits(mtp, h, ids, model, cos, sin):
    """train.py's MtpHead on the trunk's final hidden h [B, S, E]: logits [B, S-1, V], row t for token
    t+2; its router logits go to mtp._router_logits (what its aux_loss reads)."""
    s = ids.shape[1]
    e = model.model.embed_tokens(ids[:, 1:])
    eps = mtp.norm.eps
    x = mtp.fc(torch.cat([rms_norm(e, mtp.pre_fc_norm_embedding.weight, eps),
                          rms_norm(h[:, :-1], mtp.pre_fc_norm_hidden.weight, eps)], dim=-1))
    x, r = decoder_layer(mtp.layers[0], x, cos[:, : s - 1], sin[:, : s - 1])
    mtp._router_logits = [r]
    return model.lm_head(rms_norm(x, mtp.norm.weight, eps))


def rotary(model, batch, seq, device):
    """cos, sin [B, S, rotary dims] for positions 0..S-1 from the HF model's own rotary module (float32)."""
    pos = torch.arange(seq, device=device)
    x = torch.zeros(1, dtype=torch.float32, device=device)
    try:
        cos, sin = model.model.rotary_emb(x, pos.view(1, 1, -1).expand(3, batch, -1))
    except Exception:
        cos, sin = model.model.rotary_emb(x, pos.view(1, -1).expand(batch, -1))
    return cos.float(), sin.float()
