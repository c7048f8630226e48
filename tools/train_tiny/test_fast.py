"""Checks of fast.py against float64 reference code written from the definitions (runs on any torch:
python3 tools/train_tiny/test_fast.py). train.py also checks the whole forward against transformers."""
import os
import sys
import unittest

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fast  # noqa: E402


def delta_rule_steps(q, k, v, g, beta):
    """The gated delta rule one token at a time (float64)."""
    B, S, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    out = torch.zeros(B, S, hv, dv, dtype=torch.float64)
    for b in range(B):
        for h in range(hv):
            m = torch.zeros(dk, dv, dtype=torch.float64)
            src = h // (hv // hk)
            for t in range(S):
                qt = q[b, t, src].double()
                kt = k[b, t, src].double()
                qt = qt / torch.sqrt((qt * qt).sum() + 1e-6) / dk ** 0.5
                kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
                m = m * torch.exp(g[b, t, h].double())
                d = beta[b, t, h].double() * (v[b, t, h].double() - m.t() @ kt)
                m = m + torch.outer(kt, d)
                out[b, t, h] = m.t() @ qt
    return out


def inputs(B, S, hk, hv, dk, dv, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    g = -F.softplus(r(B, S, hv)) * 2.0
    beta = torch.sigmoid(r(B, S, hv))
    return r(B, S, hk, dk), r(B, S, hk, dk), r(B, S, hv, dv), g, beta


class DeltaRule(unittest.TestCase):
    def test_chunked_equals_token_by_token(self):
        for (S, chunk, hk, hv) in ((37, 8, 2, 4), (64, 16, 3, 3), (5, 64, 1, 2)):
            q, k, v, g, beta = inputs(2, S, hk, hv, 8, 6, torch.float64, S)
            got = fast.gated_delta_chunked(q, k, v, g, beta, chunk=chunk)
            want = delta_rule_steps(q, k, v, g, beta)
            self.assertEqual(got.shape, want.shape)
            err = (got - want).abs().max().item()
            self.assertLess(err, 1e-10, f"S={S} chunk={chunk}: max error {err}")

    def test_chunk_size_does_not_change_the_result(self):
        q, k, v, g, beta = inputs(1, 48, 2, 2, 8, 8, torch.float64, 3)
        a = fast.gated_delta_chunked(q, k, v, g, beta, chunk=4)
        b = fast.gated_delta_chunked(q, k, v, g, beta, chunk=48)
        self.assertLess((a - b).abs().max().item(), 1e-11)

    def test_gradients(self):
        q, k, v, g, beta = inputs(1, 11, 1, 2, 4, 3, torch.float64, 5)
        for t in (q, k, v, g, beta):
            t.requires_grad_(True)
        f = lambda *a: fast.gated_delta_chunked(*a, chunk=4)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(f, (q, k, v, g, beta)))


class FakeModule(torch.nn.Module):
    pass


def fake_moe(hidden, experts, ffn, shared_ffn, top_k, seed):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64) * 0.3  # noqa: E731
    mlp = FakeModule()
    mlp.gate = FakeModule()
    mlp.gate.weight = torch.nn.Parameter(r(experts, hidden))
    mlp.gate.top_k = top_k
    mlp.experts = FakeModule()
    mlp.experts.gate_up_proj = torch.nn.Parameter(r(experts, 2 * ffn, hidden))
    mlp.experts.down_proj = torch.nn.Parameter(r(experts, hidden, ffn))
    mlp.shared_expert = FakeModule()
    for name, shape in (("gate_proj", (shared_ffn, hidden)), ("up_proj", (shared_ffn, hidden)),
                        ("down_proj", (hidden, shared_ffn))):
        lin = torch.nn.Linear(shape[1], shape[0], bias=False).double()
        lin.weight.data = r(*shape)
        setattr(mlp.shared_expert, name, lin)
    mlp.shared_expert_gate = torch.nn.Linear(hidden, 1, bias=False).double()
    mlp.shared_expert_gate.weight.data = r(1, hidden)
    return mlp


def moe_per_token(mlp, x):
    """Each token through its top-k experts, one at a time (float64)."""
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        p = torch.softmax(mlp.gate.weight @ x[n], -1)
        w, idx = torch.topk(p, mlp.gate.top_k)
        w = w / w.sum()
        for wi, e in zip(w, idx):
            gu = mlp.experts.gate_up_proj[e] @ x[n]
            f = gu.shape[0] // 2
            out[n] += wi * (mlp.experts.down_proj[e] @ (F.silu(gu[:f]) * gu[f:]))
        sh = mlp.shared_expert
        s = sh.down_proj.weight @ (F.silu(sh.gate_proj.weight @ x[n]) * (sh.up_proj.weight @ x[n]))
        out[n] += torch.sigmoid(mlp.shared_expert_gate.weight @ x[n])[0] * s
    return out


class Moe(unittest.TestCase):
    def test_dense_equals_per_token(self):
        mlp = fake_moe(12, 6, 5, 7, 2, 1)
        x = torch.randn(2, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        got, logits = fast.moe(mlp, x)
        want = moe_per_token(mlp, x.reshape(-1, 12)).reshape(x.shape)
        self.assertLess((got - want).abs().max().item(), 1e-12)
        self.assertEqual(tuple(logits.shape), (18, 6))

    def test_unpicked_experts_get_no_gradient(self):
        mlp = fake_moe(8, 6, 4, 4, 1, 3)
        x = torch.randn(1, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
        out, logits = fast.moe(mlp, x)
        out.sum().backward()
        picked = int(torch.argmax(logits[0]))
        g = mlp.experts.gate_up_proj.grad.abs().sum((1, 2))
        self.assertGreater(g[picked].item(), 0.0)
        self.assertEqual(g.sum().item(), g[picked].item())


if __name__ == "__main__":
    unittest.main()
