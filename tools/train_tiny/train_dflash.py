"""Trains a DFlash block drafter (dflash.py, src/strata/engine/dflash.h) for a model train.py made, on the
GPU machine, and exports it as strata loads it (`--spec dflash:FILE`).

The target is frozen: its residual stream after the chosen layers (fast.taps, the float forward train.py
checks against transformers) is the drafter's context. Each step takes windows of the target's
training stream, `--anchors` random block starts per window, and trains the drafter to predict the
`--block - 1` tokens after each anchor from the context before it, with weights decaying along the
block (dflash.block_weights). Held-out windows measure how often the drafter's top-1 at each block
position equals the target's own arg-max there (what greedy verification accepts), and the chain
acceptance those rates imply.

Run (repository root, GPU machine), after train.py left its checkpoint folder (train.bin, held.bin,
tokenizer.json) and its exported hf/ directory:

    PYTHONUNBUFFERED=1 python3 tools/train_tiny/train_dflash.py --hf TRAIN_OUT/hf --data TRAIN_CKPT \\
        --minutes 5 --out DFLASH_OUT --pack "$OUT" 2>&1 | tee "$OUT/dflash.log"

or, for the shipped model with neither at hand: --target-gguf models/strata-tiny.gguf (the trunk rebuilt by
gguf_to_hf.py, Q8_0 rounding included) and a --data folder that does not exist yet (train.py's data
preparation with the bundled model's settings fills it: 400 MB of the machine's Python sources, its
tokenizer, short docstrings in 90% of the training files).

Labels: by default the target's own arg-max at each block position under teacher forcing (what greedy
verification accepts); --labels data trains on the text's next tokens instead.

Outputs in --out: dflash.gguf, dflash_reference.json (for each of train.py's prompts: the drafter's
top-5 ids and logits at every block position, the context being the prompt without its last token and
the anchor that token; float32 on the weights as exported), train_log.json.
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as TR  # noqa: E402  (blocks fla like train.py; its prompts, logging, packing)
import dflash as D  # noqa: E402
import fast  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf", default=None, help="the target: a train.py hf/ directory")
    ap.add_argument("--target-gguf", default=None,
                    help="the target as a strata GGUF instead (qwen35moe; its HF config next to it as *.hf-config.json)")
    ap.add_argument("--data", required=True,
                    help="train.py's checkpoint folder (train.bin, held.bin, tokenizer.json); made when missing")
    ap.add_argument("--labels", choices=("target", "data"), default="target",
                    help="train on the target's arg-max (default) or on the text's next tokens")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pack", default=None)
    ap.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget of the whole script")
    ap.add_argument("--reserve-s", type=float, default=40.0, help="seconds kept for evaluation and export")
    ap.add_argument("--taps", default="auto",
                    help="target layers whose outputs form the context, e.g. 1,3,5,7 (auto: every other layer, "
                         "ending with the last)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--rope-dims", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--anchors", type=int, default=16, help="blocks per window")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--eval-windows", type=int, default=64)
    return ap.parse_args()


def main():
    args = parse()
    deadline = T0 + args.minutes * 60.0 - args.reserve_s
    device = "cuda"
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    from transformers import Qwen3_5MoeForCausalLM
    if (args.hf is None) == (args.target_gguf is None):
        raise SystemExit("give the target as --hf DIR or --target-gguf FILE")
    if not os.path.exists(os.path.join(args.data, "train.bin")):
        if not args.target_gguf:
            raise SystemExit(f"{args.data} holds no train.bin: give train.py's checkpoint folder, or --target-gguf "
                             "to prepare the data with that model's tokenizer")
        TR.prepare_data(TR.parse_args(["--out", args.out, "--data-mb", "400", "--short-docstrings", "0.9",
                                       "--tokenizer-gguf", args.target_gguf]), args.data, {})
    hf_dir = args.hf
    if args.target_gguf:
        import gguf_to_hf
        hf_dir = os.path.join(args.out, "target-hf")
        config = args.target_gguf[: -len(".gguf")] + ".hf-config.json"
        gguf_to_hf.write_checkpoint(args.target_gguf, config, hf_dir)
        log(f"target rebuilt from {args.target_gguf}: held-out loss {gguf_to_hf.held_out_loss(hf_dir, args.data):.4f}")
    target = Qwen3_5MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    cfg = target.config
    n_layer, d, vocab = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    taps = list(range(n_layer - 1, -1, -2))[::-1] if args.taps == "auto" else [int(x) for x in args.taps.split(",")]
    if any(t < 0 or t >= n_layer for t in taps):
        raise SystemExit(f"--taps {taps}: the target has {n_layer} layers")
    train = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.int32)).to(device)
    held = torch.from_numpy(np.fromfile(os.path.join(args.data, "held.bin"), dtype=np.int32)).to(device)
    log(f"target {hf_dir}: {n_layer} layers, hidden {d}, vocab {vocab}; taps {taps}; "
        f"train {train.numel()} tokens, held-out {held.numel()}")

    model = D.DFlash(d=d, target_layers=taps, n_layer=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                     hd=args.head_dim, ff=args.ff, block=args.block, rope_dims=args.rope_dims,
                     rope_base=float(cfg.rope_parameters.get("rope_theta", 10000.0)), eps=cfg.rms_norm_eps,
                     vocab=vocab, context=args.seq).to(device)  # trained on contexts shorter than a window
    n_params = sum(p.numel() for p in model.parameters())
    log(f"drafter: {args.layers} layers, {args.heads}/{args.kv_heads} heads of {args.head_dim}, ffn {args.ff}, "
        f"block {args.block}: {n_params / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    weights = D.block_weights(args.block).to(device)
    gen = torch.Generator().manual_seed(args.seed + 1)
    cos, sin = fast.rotary(target, args.batch, args.seq, device)
    B, M = args.block, args.anchors

    def batch(stream, n, g):
        x = TR.make_batch(stream, stream.numel(), n, args.seq, g, device)
        anchors = torch.randint(0, args.seq - B + 1, (n, M), generator=g).to(device)
        return x, anchors

    def target_argmax(x, c, s):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return fast.trunk(target, x, c, s)[1].float().argmax(-1)  # [b, S]: the token after each position

    def rows_and_targets(x, anchors, c, s, labels_from=args.labels):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            t = fast.taps(target, x, c, s, taps).float()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            rows, labels = model.train_rows(t, x, anchors, target.model.embed_tokens)
            logits = target.lm_head(rows).float()
        if labels_from == "target":  # block position j: the target's pick after position anchor + j - 1
            pos = anchors.unsqueeze(-1) + torch.arange(B - 1, device=x.device)
            labels = torch.gather(target_argmax(x, c, s), 1, pos.reshape(x.shape[0], -1)).view(labels.shape)
        return logits, labels

    # The step time decides the step count (cosine to 10% after warmup), measured over steps 3..10.
    step, planned, t_measure, curve = 0, None, None, []
    while True:
        if planned is not None and step >= planned:
            break
        if time.time() > deadline:
            break
        frac = 0.0 if planned is None else step / max(1, planned)
        lr = args.lr * (min(1.0, (step + 1) / args.warmup) if step < args.warmup
                        else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        x, anchors = batch(train, args.batch, gen)
        logits, labels = rows_and_targets(x, anchors, cos, sin)
        ce = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="none").view(labels.shape)
        loss = (ce * weights).sum(-1).mean() / weights.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == 3:
            torch.cuda.synchronize()
            t_measure = time.time()
        if step == 10:
            torch.cuda.synchronize()
            per = (time.time() - t_measure) / 7
            planned = max(11, int((deadline - time.time()) / per * 0.95) + step)
            log(f"{per * 1000:.1f} ms/step: planned steps {planned}")
        if step % 50 == 0:
            lv = float(loss.detach())
            curve.append({"step": step, "loss": lv, "lr": lr})
            log(f"step {step}/{planned}: loss {lv:.4f} lr {lr:.2e}")

    # Held-out: the drafter's top-1 at block position j against the target's arg-max for that token.
    model.eval()
    g = torch.Generator().manual_seed(5)
    hits = torch.zeros(B - 1, device=device)
    data_hits = torch.zeros(B - 1, device=device)
    total = 0
    with torch.no_grad():
        for _ in range(max(1, args.eval_windows // args.batch)):
            x, anchors = batch(held, args.batch, g)
            logits, labels = rows_and_targets(x, anchors, cos, sin, "data")
            tl = target_argmax(x, cos, sin)
            pos = (anchors.unsqueeze(-1) + torch.arange(B - 1, device=device))  # token a+j predicted at a+j-1
            want = torch.gather(tl, 1, pos.reshape(x.shape[0], -1)).view(labels.shape)
            top1 = logits.argmax(-1)
            hits += (top1 == want).float().sum((0, 1))
            data_hits += (top1 == labels).float().sum((0, 1))
            total += labels.shape[0] * labels.shape[1]
    agree = (hits / total).tolist()
    chain = [math.prod(agree[:k + 1]) for k in range(len(agree))]
    log(f"held-out: top-1 = target arg-max by block position {[round(a, 3) for a in agree]}; "
        f"expected accepted drafts of a greedy chain {sum(chain):.2f}")

    os.makedirs(args.out, exist_ok=True)
    gguf = os.path.join(args.out, "dflash.gguf")
    D.export_gguf(model, gguf)
    # References on the weights as exported (dflash.stored_type), in float32 (TF32 off).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(D.as_exported(mod.weight))
    tok = TR.Tokenizer.from_file(os.path.join(args.data, "tokenizer.json"))
    refs = []
    for prompt in TR.PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False).ids
        x = torch.tensor([ids], device=device)
        c, s = fast.rotary(target, 1, len(ids), device)
        with torch.no_grad():
            t = fast.taps(target, x, c, s, taps)[0, :-1].float()
            lg = model.float().draft(t, ids[-1], target.model.embed_tokens, target.lm_head)
        top = lg.topk(5, -1)
        refs.append({"prompt": prompt, "ids": ids, "top5_ids": top.indices.tolist(), "top5_logits": top.values.tolist()})
    with open(os.path.join(args.out, "dflash_reference.json"), "w") as f:
        json.dump({"taps": taps, "block": B, "prompts": refs}, f, indent=1)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({"args": vars(args), "taps": taps, "params": n_params, "steps": step, "curve": curve,
                   "heldout_top1_vs_target": agree, "heldout_top1_vs_data": (data_hits / total).tolist(),
                   "expected_chain_accepts": sum(chain), "seconds": time.time() - T0}, f, indent=1)
    log(f"wrote {gguf} ({os.path.getsize(gguf) / 1e6:.1f} MB), references and the log")
    if args.pack:
        TR.pack_outputs(args.out, args.pack, [gguf, os.path.join(args.out, "dflash_reference.json"),
                                              os.path.join(args.out, "train_log.json")])


if __name__ == "__main__":
    main()
