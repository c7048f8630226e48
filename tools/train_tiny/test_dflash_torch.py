"""Checks of dflash.py (any torch, CPU: python3 tools/train_tiny/test_dflash_torch.py): the one-block
inference against a float64 reference of src/strata/engine/dflash.h's equations written here; the
training forward (many blocks, masked) against the inference path block by block; the GGUF export read
back by plan.py's reader."""
import math
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash as D  # noqa: E402
import plan as P  # noqa: E402


def small(seed=0):
    torch.manual_seed(seed)
    m = D.DFlash(d=24, target_layers=[0, 2], n_layer=2, heads=4, kv_heads=2, hd=8, ff=20, block=4, rope_dims=4,
                 vocab=50).double()
    with torch.no_grad():
        for p in m.parameters():  # larger than training's init, so that every term matters
            p.add_(torch.randn_like(p) * 0.3)
    embed = torch.nn.Embedding(50, 24).double()
    output = torch.nn.Linear(24, 50, bias=False).double()
    return m, embed, output


def reference(m, embed, output, taps, anchor):
    """The header's equations in float64 numpy, from the module's weights."""
    c = m.cfg
    W = lambda t: t.detach().numpy().astype(np.float64)  # noqa: E731
    hd, rot, eps = c["hd"], c["rope_dims"], c["eps"]

    def rms(x, w):
        return x / np.sqrt((x * x).mean() + eps) * w

    def heads(x, w, pos):
        x = x.reshape(-1, hd).copy()
        for h in range(x.shape[0]):
            x[h] = rms(x[h], w)
            for i in range(rot // 2):
                th = pos * 10000.0 ** (-2.0 * i / rot)
                a, b = x[h, i], x[h, i + rot // 2]
                x[h, i], x[h, i + rot // 2] = a * math.cos(th) - b * math.sin(th), a * math.sin(th) + b * math.cos(th)
        return x

    n, B = taps.shape[0], c["block"]
    feats = [rms(W(m.fc.weight) @ taps[p], W(m.hidden_norm)) for p in range(n)]
    x = [W(embed.weight)[anchor]] + [W(m.mask)] * (B - 1)
    x = [v.copy() for v in x]
    rep = c["heads"] // c["kv_heads"]
    for L in m.layers:
        hs = [rms(v, W(L.attn_norm)) for v in x]
        K = [heads(W(L.wk.weight) @ f, W(L.k_norm), p) for p, f in enumerate(feats)]
        V = [(W(L.wv.weight) @ f).reshape(-1, hd) for f in feats]
        K += [heads(W(L.wk.weight) @ h, W(L.k_norm), n + j) for j, h in enumerate(hs)]
        V += [(W(L.wv.weight) @ h).reshape(-1, hd) for h in hs]
        for j in range(B):
            q = heads(W(L.wq.weight) @ hs[j], W(L.q_norm), n + j)
            o = np.zeros_like(q)
            for h in range(q.shape[0]):
                s = np.array([q[h] @ k[h // rep] for k in K]) / math.sqrt(hd)
                e = np.exp(s - s.max())
                o[h] = sum(w * v[h // rep] for w, v in zip(e / e.sum(), V))
            x[j] = x[j] + W(L.wo.weight) @ o.reshape(-1)
        for j in range(B):
            g = rms(x[j], W(L.ffn_norm))
            a, u = W(L.gate.weight) @ g, W(L.up.weight) @ g
            x[j] = x[j] + W(L.down.weight) @ (a / (1 + np.exp(-a)) * u)
    return np.stack([W(output.weight) @ rms(x[j], W(m.output_norm)) for j in range(1, B)])


class DFlashTorch(unittest.TestCase):
    def test_draft_matches_the_float64_reference(self):
        m, embed, output = small()
        taps = torch.randn(6, 48, dtype=torch.float64)
        got = m.draft(taps, 7, embed, output).numpy()
        want = reference(m, embed, output, taps.numpy(), 7)
        self.assertLess(np.abs(got - want).max(), 1e-9 * max(1.0, np.abs(want).max()))

    def test_training_rows_are_the_inference_blocks(self):
        m, embed, output = small(1)
        S = 12
        taps = torch.randn(2, S, 48, dtype=torch.float64)
        ids = torch.randint(0, 50, (2, S))
        anchors = torch.tensor([[0, 5, 8], [3, 3, 7]])
        rows, labels = m.train_rows(taps, ids, anchors, embed)
        self.assertEqual(tuple(rows.shape), (2, 3, 3, 24))
        for i in range(2):
            for k in range(3):
                a = int(anchors[i, k])
                want = m.draft(taps[i, :a], int(ids[i, a]), embed, output)  # a == 0: no context at all
                got = output(rows[i, k])
                self.assertLess(float((got - want).abs().max()), 1e-9)
                self.assertEqual(labels[i, k].tolist(), ids[i, a + 1:a + 4].tolist())

    def test_context_window(self):
        m, embed, output = small(2)
        m.cfg["context"] = 3
        S = 12
        taps = torch.randn(1, S, 48, dtype=torch.float64)
        ids = torch.randint(0, 50, (1, S))
        anchors = torch.tensor([[2, 6, 8]])
        rows, _ = m.train_rows(taps, ids, anchors, embed)
        for k in range(3):
            a = int(anchors[0, k])
            want = m.draft(taps[0, :a], int(ids[0, a]), embed, output)
            self.assertLess(float((output(rows[0, k]) - want).abs().max()), 1e-9)
        m.cfg["context"] = 0
        full = m.draft(taps[0, :8], int(ids[0, 8]), embed, output)
        self.assertGreater(float((output(rows[0, 2]) - full).abs().max()), 1e-6)  # the window mattered

    def test_block_weights_decay(self):
        w = D.block_weights(8)
        self.assertEqual(len(w), 7)
        self.assertAlmostEqual(float(w[0]), 1.0)
        self.assertTrue(all(float(w[i]) > float(w[i + 1]) for i in range(6)))

    def test_export_reads_back(self):
        m, _, _ = small()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "d.gguf")
            D.export_gguf(m, path)
            meta, infos, data_start = P.read_gguf(path)
            self.assertEqual(meta["general.architecture"], "dflash")
            self.assertEqual(meta["dflash.target_layers"], [0, 2])
            self.assertEqual(meta["dflash.block_size"], 4)
            self.assertEqual(meta["dflash.context_length"], 0)
            by = {n: (dims, t, off) for n, dims, t, off in infos}
            self.assertEqual(by["fc.weight"][0], [48, 24])  # ne0 = the row (input) length
            self.assertEqual(by["fc.weight"][1], 1)         # F16: rows of 48, not whole Q8_0 blocks
            self.assertEqual(by["blk.1.ffn_down.weight"][0], [20, 24])
            self.assertEqual(by["output_norm.weight"][1], 0)  # F32
            dims, _, off = by["mask_embd.weight"]
            with open(path, "rb") as f:
                f.seek(data_start + off)
                got = np.frombuffer(f.read(4 * 24), dtype="<f4")
            self.assertTrue(np.allclose(got, m.mask.detach().float().numpy()))
            self.assertEqual(data_start % 32, 0)
            # Every tensor reads back as the export rounds it.
            meta2, tensors = D.read_gguf(path)
            self.assertEqual(meta2["dflash.block_size"], 4)
            self.assertNotIn("__version__", meta2)
            got = dict(tensors)
            self.assertTrue(np.array_equal(got["fc.weight"], D.as_exported(m.fc.weight).numpy()))
            self.assertEqual(by["blk.0.attn_output.weight"][1], 8)  # Q8_0: rows of 32
            wo = D.as_exported(m.layers[0].wo.weight).numpy()
            self.assertTrue(np.array_equal(got["blk.0.attn_output.weight"], wo))
            self.assertFalse(np.array_equal(wo, m.layers[0].wo.weight.detach().float().numpy()))
            self.assertTrue(np.array_equal(got["mask_embd.weight"], m.mask.detach().float().numpy()))

    def test_q8_0_rounding(self):
        a = np.random.default_rng(3).normal(size=(5, 64)).astype(np.float32)
        a[2, :32] = 0  # an all-zero block
        raw = D.q8_0_bytes(a)
        self.assertEqual(len(raw), 10 * 34)
        back = D.q8_0_values(raw, a.size).reshape(a.shape)
        d16 = np.frombuffer(raw, dtype=[("d", "<f2"), ("q", "i1", 32)])["d"].astype(np.float64)
        err = np.abs(back.astype(np.float64) - a).reshape(-1, 32).max(1)
        self.assertTrue(np.all(err <= 0.5 * d16 * (1 + 1e-6)))  # half a step of the stored scale
        self.assertTrue(np.allclose(d16, np.abs(a.reshape(-1, 32)).max(1) / 127, rtol=2 ** -10))
        self.assertTrue(np.all(back[2, :32] == 0))
        self.assertGreater(np.abs(back - a).max(), 0)  # it did round
        self.assertEqual(D.stored_type((7, 64)), D.GGML_Q8_0)
        self.assertEqual(D.stored_type((7, 48)), D.GGML_F16)
        self.assertEqual(D.stored_type((64,)), D.GGML_F32)


if __name__ == "__main__":
    unittest.main()
