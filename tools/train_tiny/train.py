#!/usr/bin/env python3
"""Train a tiny qwen3_5_moe-architecture model on Python source, for strata's end-to-end tests (issue 5).

Runs ONLY on the GPU machine (torch 2.11, transformers 5.17, tokenizers 0.23 there). One command does
everything inside a wall-clock budget (--minutes, the whole script, default 8.5):

  1. collect *.py files from the interpreter's stdlib and site-packages (sorted, capped, deterministic),
     split train / held-out by a hash of each file's path (2 % held out, whole files);
  2. train a byte-level BPE tokenizer (HF tokenizers; Qwen2 split regex, NFC) with 8192 tokens
     including <|endoftext|> <|im_start|> <|im_end|> (special) and <think> </think> <tool_call>
     </tool_call> (added, not special, as in Qwen3), and save it with a ChatML chat template;
  3. train Qwen3_5MoeForCausalLM (8 layers in the 3 DeltaNet : 1 full-attention pattern, 32 experts
     top-4 plus a shared expert, ~22M parameters) with AdamW and bf16 autocast; the step count is
     measured to fit the budget (or fixed with --steps);
  4. round the weights to bfloat16, save the HF checkpoint, reload it as float32 (exactly the bf16
     values) and compute every reference with it on the GPU with TF32 off, eager attention and eager
     experts: held-out perplexity, per-layer routing counts and skew, greedy continuations (manual
     argmax loop re-running the whole sequence; no cache) and the logits at every prompt position;
  5. optionally pack the output directory as a tar split into <= 15 MiB parts (--pack DIR).

    python3 tools/train_tiny/train.py --out /tmp/train_tiny --pack "$OUT"

Bigger runs (README.md): --preset picks a shape sized for a quant (plan.py prints the expected GGUF
sizes); --ckpt DIR with --total-steps/--tokens/--train-minutes makes a run that spans several calls
(--resume continues it exactly: model, optimizer, step, data-sampling and RNG state; the data and
tokenizer are cached in DIR); --tokenizer-gguf reuses the bundled model's tokenizer; --mtp 1 trains
and exports Qwen3.5's multi-token-prediction layer under the released checkpoints' mtp.* names.

Facts used (read in transformers' sources, not copied): Qwen3_5MoeTextConfig fields (layer_types,
linear_*, moe_intermediate_size, shared_expert_intermediate_size, num_experts(_per_tok),
output_router_logits, router_aux_loss_coef, rope_parameters with partial_rotary_factor); the router
module `mlp.gate` returns (router_logits, top-k weights, top-k indices); the experts dispatcher reads
config._experts_implementation ("eager" / "grouped_mm") at call time; the gated-DeltaNet functions
fall back to torch code when `fla` / `causal_conv1d` cannot be imported.
"""

import time

T0 = time.time()  # the budget counts from here, before the heavy imports

import argparse  # noqa: E402
import copy  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import site  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import tarfile  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fast  # noqa: E402  (the fast training forward; checked against the HF one before use)
import plan as P  # noqa: E402  (torch-free: presets, sizes, schedule, held-out rule, GGUF reader)
from plan import lr_at, path_hash  # noqa: E402,F401

# Use the pure-torch gated-DeltaNet / causal-conv1d code (what the references must use, and what
# works without extra packages): block the optional kernel packages before transformers imports.
_BLOCKED = ("fla", "causal_conv1d")
_FOUND = {}
for _n in _BLOCKED:
    try:
        _FOUND[_n] = importlib.util.find_spec(_n) is not None
    except (ImportError, ValueError):
        _FOUND[_n] = False
    sys.modules[_n] = None  # type: ignore[assignment]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import processors, trainers  # noqa: E402

# The Qwen2 pre-tokenizer split regex, exactly as in Qwen3's tokenizer.json (pre_tokenizer.pretokenizers[0]):
# contractions, letters with one optional leading non-letter, single digits, punctuation runs with
# trailing newlines, newline runs, trailing spaces, spaces.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # special (control) tokens
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # added, not special (as Qwen3)
EOS_TOKEN = "<|endoftext|>"  # base model trained on raw files separated by <|endoftext|>

# A minimal ChatML template (our own words): <|im_start|>role\ncontent<|im_end|>\n per message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Prompts for the greedy references. The long one crosses HF's 64-token DeltaNet chunk boundary; the
# ChatML one exercises special-token handling.
PROMPTS = [
    "def fibonacci(n):",
    "import os\n",
    "class Stack:",
    (
        "import json\nimport os\n\n\ndef load_config(path, defaults=None):\n"
        "    \"\"\"Read a JSON file and merge it over the defaults.\"\"\"\n"
        "    result = dict(defaults or {})\n"
        "    if not os.path.exists(path):\n"
        "        return result\n"
        "    with open(path, encoding=\"utf-8\") as f:\n"
        "        data = json.load(f)\n"
        "    for key, value in data.items():\n"
    ),
    "<|im_start|>user\nWrite a function that adds two numbers.<|im_end|>\n<|im_start|>assistant\n",
]
N_GREEDY = 32
PART_BYTES = 15 * 1024 * 1024
MAX_PACK_FILES = 8
MAX_PACK_BYTES = 62 * 1024 * 1024


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def elapsed():
    return time.time() - T0


# ----------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------

def source_roots():
    """(label, path) for the stdlib and every site-packages directory, de-duplicated."""
    paths = sysconfig.get_paths()
    cands = [("stdlib", paths.get("stdlib")), ("purelib", paths.get("purelib")), ("platlib", paths.get("platlib"))]
    try:
        for i, p in enumerate(site.getsitepackages()):
            cands.append((f"site{i}", p))
    except Exception:
        pass
    seen, roots = set(), []
    for label, p in cands:
        if p and os.path.isdir(p):
            rp = os.path.realpath(p)
            if rp not in seen:
                seen.add(rp)
                roots.append((label, rp))
    return roots


def collect_files(max_bytes, min_size=200, max_size=400_000):
    """All *.py files under the roots, keyed by 'label/relative/path'; select by path-hash order until
    max_bytes. Returns list of (key, realpath, size) in selection order."""
    roots = source_roots()
    log("source roots:", roots)
    found, seen_real = [], set()
    for label, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                full = os.path.join(dirpath, fn)
                try:
                    real = os.path.realpath(full)
                    if real in seen_real:
                        continue
                    size = os.path.getsize(real)
                except OSError:
                    continue
                seen_real.add(real)
                if min_size <= size <= max_size:
                    key = f"{label}/{os.path.relpath(full, root)}"
                    found.append((path_hash(key), key, real, size))
    found.sort()
    total_all = sum(f[3] for f in found)
    log(f"found {len(found)} candidate .py files, {total_all / 1e6:.1f} MB")
    chosen, total = [], 0
    for h, key, real, size in found:
        if total >= max_bytes:
            break
        chosen.append((key, real, size))
        total += size
    return chosen, len(found), total_all


def read_texts(chosen, heldout_percent):
    """Read the chosen files; drop undecodable ones and ones containing our special-token strings
    (so literal '<|endoftext|>' in some source file cannot become a control token)."""
    markers = SPECIAL_TOKENS + ADDED_TOKENS
    train, held, skipped = [], [], 0
    for key, real, _ in chosen:
        try:
            with open(real, "rb") as f:
                text = f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            skipped += 1
            continue
        if any(m in text for m in markers):
            skipped += 1
            continue
        is_held = P.is_heldout(key, heldout_percent)
        (held if is_held else train).append((key, text))
    return train, held, skipped


# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------

def set_text_pipeline(tok):
    """NFC, Qwen2's split regex + byte-level pre-tokenizer (as Qwen3's tokenizer.json), byte-level decoder:
    one definition for the trained tokenizer and the one rebuilt from a GGUF, so both encode alike."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)


def add_control_tokens(tok):
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED_TOKENS])


def train_tokenizer(texts, vocab_size, max_train_bytes):
    n_extra = len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    set_text_pipeline(tok)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_extra,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    sample, total = [], 0
    for t in texts:
        if total >= max_train_bytes:
            break
        sample.append(t)
        total += len(t)
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    n_bpe = tok.get_vocab_size()
    if n_bpe != vocab_size - n_extra:
        raise RuntimeError(f"BPE training produced {n_bpe} tokens, wanted {vocab_size - n_extra}")
    add_control_tokens(tok)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS + ADDED_TOKENS}
    assert all(v is not None for v in ids.values()), ids
    return tok, ids, total


def tokenizer_from_gguf(path, vocab_size):
    """The bundled model's exact tokenizer, rebuilt from a strata GGUF's tokens and merges (same
    normaliser, pre-tokenizer and decoder as train_tokenizer), so a retrained model keeps its token ids
    and its held-out windows are the same tokens as the old model's."""
    tokens, merges, types = P.gguf_tokenizer(path)
    if len(tokens) != vocab_size:
        raise SystemExit(f"{path}: {len(tokens)} tokens, --vocab is {vocab_size}")
    bpe_vocab = {t: i for i, t in enumerate(tokens) if types is None or types[i] == 1}
    tok = Tokenizer(models.BPE(vocab=bpe_vocab, merges=[tuple(m.split(" ", 1)) for m in merges], unk_token=None,
                               fuse_unk=False, byte_fallback=False))
    set_text_pipeline(tok)
    add_control_tokens(tok)
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS + ADDED_TOKENS}
    for s, i in ids.items():
        if i is None or tokens[i] != s:
            raise SystemExit(f"{path}: {s!r} is not at the id the GGUF gives it")
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"tokenizer from {path} has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok, ids


def save_tokenizer(tok, ids, hf_dir):
    tok.save(os.path.join(hf_dir, "tokenizer.json"))
    added = {}
    for s in SPECIAL_TOKENS + ADDED_TOKENS:
        added[str(ids[s])] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": s in SPECIAL_TOKENS}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(hf_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)


def encode_stream(tok, texts, eot_id, batch=2000):
    """Concatenate every file's ids followed by <|endoftext|>, as int32."""
    parts = []
    for i in range(0, len(texts), batch):
        encs = tok.encode_batch(texts[i:i + batch], add_special_tokens=False)
        for e in encs:
            a = np.asarray(e.ids, dtype=np.int32)
            parts.append(a)
            parts.append(np.asarray([eot_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# ----------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------

def make_config(args, vocab_size, eot_id, attn_impl, experts_impl):
    from transformers import Qwen3_5MoeTextConfig

    n_layers = args.layers
    layer_types = P.layer_types(n_layers)
    head_dim = P.HEAD_DIM
    rotary_half = int(head_dim * 0.25) // 2  # 8 frequencies; mrope sections must sum to this
    return Qwen3_5MoeTextConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=4096,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [rotary_half - 2 * (rotary_half // 3), rotary_half // 3, rotary_half // 3],
            "mrope_interleaved": True,
        },
        attention_bias=False,
        attention_dropout=0.0,
        linear_conv_kernel_dim=P.CONV_KERNEL,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_num_key_heads=args.lin_k_heads,
        linear_num_value_heads=args.lin_v_heads,
        moe_intermediate_size=args.moe_ffn,
        shared_expert_intermediate_size=args.shared_ffn,
        num_experts_per_tok=args.top_k,
        num_experts=args.experts,
        output_router_logits=False,
        router_aux_loss_coef=args.aux_coef,
        layer_types=layer_types,
        bos_token_id=None,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        attn_implementation=attn_impl,
        experts_implementation=experts_impl,
    )


def set_impl(model, attn=None, experts=None):
    cfg = model.config
    if attn is not None:
        cfg._attn_implementation = attn
    if experts is not None:
        try:
            cfg._experts_implementation = experts
        except Exception as e:
            log(f"note: cannot set experts implementation ({e!r})")
    return getattr(cfg, "_attn_implementation", None), getattr(cfg, "_experts_implementation", None)


def gdn_functions():
    try:
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
    except Exception as e:
        return {"error": repr(e)}
    out = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
        fn = getattr(m, name, None)
        inner = getattr(fn, "__wrapped__", fn)
        out[name] = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', '?')}"
    return out


def param_breakdown(model):
    groups = {}
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            g = "embedding"
        elif name.startswith("lm_head"):
            g = "lm_head"
        elif ".mlp.experts." in name:
            g = "routed experts"
        elif ".mlp.shared_expert" in name:
            g = "shared expert"
        elif ".mlp.gate." in name:
            g = "router"
        elif ".linear_attn." in name:
            g = "gated DeltaNet"
        elif ".self_attn." in name:
            g = "full attention"
        else:
            g = "norms/other"
        groups[g] = groups.get(g, 0) + p.numel()
    return groups


# ----------------------------------------------------------------------------------------------------
# Training helpers
# ----------------------------------------------------------------------------------------------------

def make_batch(data_gpu, n_tokens, batch, seq, gen, device):
    starts = torch.randint(0, n_tokens - seq - 1, (batch,), generator=gen)
    idx = starts.to(device)[:, None] + torch.arange(seq, device=device)[None, :]
    return data_gpu[idx].long()


def eval_windows(stream, seq, max_windows):
    n = min(max_windows, (len(stream) - 1) // seq)
    if n <= 0:
        raise RuntimeError(f"held-out stream too short ({len(stream)} tokens) for one window of {seq}")
    return torch.from_numpy(stream[: n * seq].astype(np.int64).reshape(n, seq))


@torch.no_grad()
def mean_loss(model, windows, device, batch, use_autocast):
    """Token-weighted next-token cross-entropy over all windows (each window predicts seq-1 tokens)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
            logits = model(input_ids=x, use_cache=False).logits
        logits = logits.float()
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += x[:, 1:].numel()
    if was_training:
        model.train()
    return total / count


class MtpHead(torch.nn.Module):
    """Qwen3.5's multi-token-prediction block, with the submodule names of the released checkpoints'
    `mtp.*` tensors (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*, mtp.norm).
    Row t takes the trunk's final hidden state h_t (after the model's output norm) and the embedding of
    token t+1: x = fc([pre_fc_norm_embedding(embed(x_{t+1})); pre_fc_norm_hidden(h_t)]) (embedding half
    first), one full-attention MoE decoder layer at position t, norm, then the trunk's lm_head; it
    predicts token t+2. The embedding and lm_head are the trunk's (shared, as in Qwen3.5)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
        self.cfg = copy.deepcopy(cfg)
        self.cfg._attn_implementation = "sdpa"  # no mask given: sdpa runs causal
        full_idx = self.cfg.layer_types.index("full_attention")
        E, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = m.Qwen3_5MoeRMSNorm(E, eps=eps)
        self.pre_fc_norm_hidden = m.Qwen3_5MoeRMSNorm(E, eps=eps)
        self.fc = torch.nn.Linear(2 * E, E, bias=False)
        self.layers = torch.nn.ModuleList([m.Qwen3_5MoeDecoderLayer(self.cfg, full_idx)])
        self.norm = m.Qwen3_5MoeRMSNorm(E, eps=eps)
        self.full_idx = full_idx
        # As the trunk's _init_weights: matrices (and the stacked experts) N(0, initializer_range); every
        # 1-D parameter here is a zero-centred RMSNorm weight, 0.
        with torch.no_grad():
            for _, p in self.named_parameters():
                if p.ndim >= 2:
                    p.normal_(0.0, cfg.initializer_range)
                else:
                    p.zero_()
        self._lb = getattr(m, "load_balancing_loss_func", None)
        self._router_logits = []
        self.layers[0].mlp.gate.register_forward_hook(self._keep_router_logits)

    def _keep_router_logits(self, mod, inp, out):
        self._router_logits.append(out[0] if isinstance(out, tuple) else out)

    def set_experts(self, impl):
        try:
            self.cfg._experts_implementation = impl
        except Exception as e:
            log(f"note: cannot set the MTP head's experts implementation ({e!r})")

    def forward(self, h, ids, trunk):
        """h: [B, S, E] trunk output (after its norm); ids: [B, S]. Returns logits [B, S-1, V]; row t
        predicts ids[:, t+2] (the last row has no target inside the window)."""
        self._router_logits = []
        B, S, _ = h.shape
        e = trunk.model.embed_tokens(ids[:, 1:])
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(h[:, :-1])], dim=-1))
        pos = torch.arange(S - 1, device=ids.device)
        pos3 = pos.view(1, 1, -1).expand(3, B, -1)
        # cos/sin from the float32 embedding, as the trunk computes them from its float32 input.
        try:
            pe = trunk.model.rotary_emb(e, pos3)  # multimodal-rope layout: (3, batch, positions)
        except Exception:
            pe = trunk.model.rotary_emb(e, pos.view(1, -1).expand(B, -1))
        x = self.layers[0](x, position_embeddings=pe, attention_mask=None, position_ids=pos.view(1, -1).expand(B, -1))
        if isinstance(x, tuple):
            x = x[0]
        return trunk.lm_head(self.norm(x))

    def aux_loss(self):
        if self._lb is None or not self._router_logits:
            return None
        try:
            return self._lb(tuple(self._router_logits), self.cfg.num_experts, self.cfg.num_experts_per_tok)
        except Exception as e:  # an API change must not stop a multi-call run: train the head without it
            log(f"note: no load-balancing loss for the MTP router ({type(e).__name__}: {str(e)[:120]})")
            self._lb = None
            return None


def capture_final_hidden(model):
    """A hook on the trunk's output norm keeps its output (what the MTP head reads) in box['h']."""
    box = {}

    def hook(mod, inp, out):
        box["h"] = out

    return box, model.model.norm.register_forward_hook(hook)


def fast_losses(model, x, use_aux, mtp, rope):
    """fast.py's forward: (loss as the HF model reports it, aux loss or None, MTP logits or None)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
    cfg = model.config
    h, logits, router = fast.trunk(model, x, *rope)
    loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    aux = None
    if use_aux:
        aux = m.load_balancing_loss_func(tuple(router), cfg.num_experts, cfg.num_experts_per_tok)
        loss = loss + cfg.router_aux_loss_coef * aux
    mlogits = fast.mtp_logits(mtp, h, x, model, *rope) if mtp is not None else None
    return loss, aux, mlogits, logits


def train_step(model, opt, x, use_autocast, use_aux, mtp=None, mtp_weight=0.0, box=None, aux_coef=0.0, fast_fn=None,
               rope=None):
    """One optimizer step; with fast_fn (fast_losses or its compiled form) the forward is fast.py's."""
    mtp_loss = None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
        if fast_fn is not None:
            loss, aux, mlogits, _ = fast_fn(model, x, use_aux, mtp, rope)
        else:
            out = model(input_ids=x, labels=x, use_cache=False, output_router_logits=use_aux)
            loss = out.loss
            aux = out.aux_loss if (use_aux and out.aux_loss is not None) else None
            mlogits = mtp(box["h"], x, model) if mtp is not None else None
        total = loss
        if mtp is not None:
            mtp_loss = F.cross_entropy(mlogits[:, :-1].float().reshape(-1, mlogits.shape[-1]), x[:, 2:].reshape(-1))
            total = loss + mtp_weight * mtp_loss
            maux = mtp.aux_loss() if use_aux else None
            if maux is not None:
                total = total + mtp_weight * aux_coef * maux
    total.backward()
    params = list(model.parameters()) + (list(mtp.parameters()) if mtp is not None else [])
    gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return (loss.detach(), (aux.detach() if isinstance(aux, torch.Tensor) else None), gnorm.detach(),
            (mtp_loss.detach() if mtp_loss is not None else None))


def check_fast(model, mtp, box, x, use_aux, device):
    """fast.py against the HF forward on one batch, float32 (TF32 off): logits, loss, aux loss, MTP logits
    and every parameter's gradient. Returns the worst relative differences; exits when one is too big."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    params = [(n, p) for n, p in model.named_parameters()] + (
        [("mtp." + n, p) for n, p in mtp.named_parameters()] if mtp is not None else [])

    def run(use_fast):
        for _, p in params:
            p.grad = None
        if use_fast:
            loss, aux, mlogits, logits = fast_losses(model, x, use_aux, mtp, fast.rotary(model, x.shape[0], x.shape[1],
                                                                                          device))
        else:
            out = model(input_ids=x, labels=x, use_cache=False, output_router_logits=use_aux)
            loss, aux, logits = out.loss, out.aux_loss, out.logits
            mlogits = mtp(box["h"], x, model) if mtp is not None else None
        total = loss + (mlogits.float().square().mean() if mlogits is not None else 0.0)
        total.backward()
        grads = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
        return loss.detach(), (aux.detach() if aux is not None else None), logits.detach(), (
            mlogits.detach() if mlogits is not None else None), grads

    ref, got = run(False), run(True)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    for _, p in params:
        p.grad = None
    rel = lambda a, b: float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))  # noqa
    report = {"loss": abs(float(got[0] - ref[0])), "logits": rel(got[2], ref[2])}
    if ref[1] is not None:
        report["aux"] = abs(float(got[1] - ref[1]))
    if ref[3] is not None:
        report["mtp_logits"] = rel(got[3], ref[3])
    missing = sorted(set(ref[4]) ^ set(got[4]))
    worst = max(((rel(got[4][n], g), n) for n, g in ref[4].items() if n in got[4]), default=(0.0, ""))
    report["grad"], report["grad_worst"] = worst
    log(f"fast forward against HF (float32): {report}")
    bad = missing or report["loss"] > 1e-4 or report["logits"] > 1e-4 or report.get("aux", 0.0) > 1e-4 or \
        report.get("mtp_logits", 0.0) > 1e-4 or report["grad"] > 1e-2
    if bad:
        sys.exit(f"fast.py disagrees with the HF forward ({report}; gradients only in one: {missing[:5]}); "
                 f"train with --fast 0")
    return report


@torch.no_grad()
def mtp_eval(model, mtp, box, windows, device, batch, use_autocast):
    """Held-out MTP numbers: cross-entropy of token t+2, top-1 accuracy against the data, and how often
    its arg-max equals the trunk's own arg-max for t+2 (what greedy speculation accepts)."""
    was = (model.training, mtp.training)
    model.eval()
    mtp.eval()
    total, correct, agree, count = 0.0, 0, 0, 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
            tl = model(input_ids=x, use_cache=False).logits
            ml = mtp(box["h"], x, model)
        ml = ml[:, :-1].float()
        tgt = x[:, 2:]
        total += float(F.cross_entropy(ml.reshape(-1, ml.shape[-1]), tgt.reshape(-1), reduction="sum"))
        pred = ml.argmax(-1)
        correct += int((pred == tgt).sum())
        agree += int((pred == tl[:, 1:-1].float().argmax(-1)).sum())
        count += tgt.numel()
    if was[0]:
        model.train()
    if was[1]:
        mtp.train()
    return {"loss": total / count, "top1_vs_data": correct / count, "top1_vs_trunk_argmax": agree / count,
            "tokens": count}


def choose_experts_impl(model, x, use_autocast):
    """Prefer grouped_mm (fewer kernel launches) when it runs and matches eager on one batch."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def loss_with(impl):
        set_impl(model, experts=impl)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
            out = model(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    chosen = "eager"
    try:
        le = loss_with("eager")
        t = time.time()
        lg = loss_with("grouped_mm")
        log(f"experts trial: eager loss {le:.5f}, grouped_mm loss {lg:.5f} ({time.time() - t:.2f}s)")
        if abs(le - lg) < 0.02:
            chosen = "grouped_mm"
        else:
            log("grouped_mm disagrees with eager; using eager")
    except Exception as e:
        log(f"grouped_mm unavailable ({type(e).__name__}: {str(e)[:200]}); using eager experts")
    model.load_state_dict(state)
    set_impl(model, experts=chosen)
    return chosen


# ----------------------------------------------------------------------------------------------------
# References on the bf16-rounded weights
# ----------------------------------------------------------------------------------------------------

@torch.no_grad()
def greedy_manual(model, ids, n, device):
    seq = list(ids)
    new, margins, top5, prompt_logits = [], [], [], None
    for step in range(n):
        logits = model(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0].float()
        if step == 0:
            prompt_logits = logits.cpu().numpy().astype("<f4")
        last = logits[-1]
        vals, idx = torch.topk(last, 5)
        nxt = int(idx[0])
        margins.append(float(vals[0] - vals[1]))
        top5.append([[int(i), float(v)] for v, i in zip(vals.tolist(), idx.tolist())])
        new.append(nxt)
        seq.append(nxt)
    return new, margins, top5, prompt_logits


@torch.no_grad()
def greedy_generate(model, ids, n, device, pad_id):
    try:
        x = torch.tensor([ids], device=device)
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=pad_id)
        return [int(t) for t in out[0, len(ids):].tolist()], None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def routing_stats(counts, top_frac=0.2):
    """counts: [layers, experts] int. Skew = share of assignments taken by the top 20 % of experts."""
    n_exp = counts.shape[1]
    n_top = max(1, int(round(top_frac * n_exp)))
    rows = []
    for layer in range(counts.shape[0]):
        c = counts[layer].astype(np.float64)
        tot = c.sum()
        srt = np.sort(c)[::-1]
        p = c / tot if tot > 0 else c
        nz = p[p > 0]
        rows.append({
            "layer": layer,
            "assignments": int(tot),
            "top20_share": float(srt[:n_top].sum() / tot) if tot > 0 else None,
            "max_share": float(srt[0] / tot) if tot > 0 else None,
            "unused_experts": int((c == 0).sum()),
            "entropy_bits": float(-(nz * np.log2(nz)).sum()),
        })
    return {"num_experts": n_exp, "n_top_experts": n_top, "uniform_top20_share": n_top / n_exp, "per_layer": rows}


def pack_outputs(out_dir, pack_dir, extra_files):
    """Tar out_dir into 15 MiB parts in <out_dir>.parts/, then copy the small extra files and as many
    parts as the returnable limits allow into pack_dir. Parts that do not fit stay in the staging
    folder; the log prints the command that ships them in a later call (cp into $OUT)."""
    os.makedirs(pack_dir, exist_ok=True)
    base = os.path.basename(os.path.normpath(out_dir))
    parent = os.path.dirname(os.path.normpath(out_dir))
    stage = os.path.join(parent, base + ".parts")
    if os.path.isdir(stage):
        shutil.rmtree(stage)
    os.makedirs(stage)
    tar_path = os.path.join(parent, base + ".tar")
    with tarfile.open(tar_path, "w") as tf:
        tf.add(out_dir, arcname=base)
    size = os.path.getsize(tar_path)
    parts = []
    with open(tar_path, "rb") as f:
        k = 0
        while True:
            chunk = f.read(PART_BYTES)
            if not chunk:
                break
            p = os.path.join(stage, f"{base}.tar.part{k:02d}")
            with open(p, "wb") as g:
                g.write(chunk)
            parts.append(p)
            k += 1
    os.remove(tar_path)
    copied, used = [], 0
    slots = MAX_PACK_FILES - 1  # keep one slot for a tee'd stdout log
    for src in extra_files:
        if len(copied) >= slots - 1:
            break
        dst = os.path.join(pack_dir, os.path.basename(src))
        shutil.copyfile(src, dst)
        copied.append(dst)
        used += os.path.getsize(dst)
    shipped, left = [], []
    for p in parts:
        if len(copied) + len(shipped) < slots and used + os.path.getsize(p) <= MAX_PACK_BYTES:
            dst = os.path.join(pack_dir, os.path.basename(p))
            shutil.copyfile(p, dst)
            shipped.append(dst)
            used += os.path.getsize(p)
        else:
            left.append(p)
    log(f"packed {size} bytes into {len(parts)} parts in {stage}; {len(shipped)} parts + {len(copied)} files "
        f"in {pack_dir} ({used} bytes)")
    log(f"reassemble with: cat {base}.tar.part* | tar x")
    if left:
        per_call = max(1, min(slots, MAX_PACK_BYTES // PART_BYTES))
        log(f"{len(left)} part(s) did not fit in one call's returnable files; ship them with later calls, "
            f"{per_call} parts each:")
        for i in range(0, len(left), per_call):
            log("  cp " + " ".join(left[i:i + per_call]) + ' "$OUT"/')
    return [os.path.basename(p) for p in shipped + copied]


# ----------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OLD_LOG = os.path.join(REPO, "models", "train_log.json")


def parse_args(argv=None):
    return P.parse_args(argv)


def load_plan(args):
    """First call: write <ckpt>/plan.json (settings, total steps, warmup). --resume: read it back and
    take every run-defining setting from it, so later calls cannot change the run by accident."""
    if not args.ckpt:
        return None
    ckpt = os.path.abspath(args.ckpt)
    path = os.path.join(ckpt, "plan.json")
    if args.resume:
        if not os.path.exists(path):
            raise SystemExit(f"--resume: {path} does not exist (start the run without --resume)")
        with open(path) as f:
            plan = json.load(f)
        for k in P.PLAN_KEYS:
            if k in plan["args"]:
                setattr(args, k, plan["args"][k])
        args.max_params = float("inf")  # checked by the first call
        if plan["total_steps"] is None:
            raise SystemExit(f"{path}: the first call stopped before it fixed the step count; start a new run")
        log(f"resuming the run in {ckpt}: {plan['total_steps']} planned steps, settings from plan.json")
        return plan
    if os.path.exists(path):
        raise SystemExit(f"{path} exists: pass --resume to continue that run, or use a new --ckpt folder")
    if args.total_steps is not None:
        total = args.total_steps
    elif args.tokens is not None:
        total = P.total_steps_for(P.parse_count(args.tokens), args.batch, args.seq)
    else:
        total = None  # fixed at step 25 of this call from the measured step time (--train-minutes)
    warmup = args.warmup if total is None or total >= 4 * args.warmup else max(1, total // 10)
    plan = {"args": {k: getattr(args, k) for k in P.PLAN_KEYS}, "total_steps": total, "warmup": warmup,
            "train_minutes": args.train_minutes, "argv_first_call": sys.argv}
    os.makedirs(ckpt, exist_ok=True)
    write_plan(ckpt, plan)
    log(f"new run in {ckpt}: " + (f"{total} steps ({total * args.batch * args.seq / 1e6:.1f}M tokens)" if total
                                  else f"{args.train_minutes} minutes of training, steps fixed at step 25")
        + f", warmup {warmup}")
    return plan


def write_plan(ckpt, plan):
    path = os.path.join(ckpt, "plan.json")
    with open(path + ".tmp", "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def old_model_heldout():
    """The bundled model's held-out record (models/train_log.json), when the repository has it."""
    try:
        with open(OLD_LOG) as f:
            d = json.load(f)
        # A retrained bundled model records the files its predecessors were evaluated on as eval_keys.
        data = d["data"]
        if "eval_keys" in data:
            keys, tokens = data["eval_keys"], data["eval_tokens"]
        else:
            keys, tokens = data["heldout_keys"], data["heldout_tokens"]
        return {"keys": keys, "tokens": tokens,
                "loss": d["final_heldout"]["loss"], "ppl": d["final_heldout"]["ppl"],
                "windows": d["final_heldout"]["windows"], "seq": d["final_heldout"]["seq"]}
    except (OSError, KeyError, ValueError):
        return None


def prepare_data(args, cache_dir, timings):
    """Files, split, tokenizer and token streams; cached in cache_dir (the checkpoint folder) so later
    calls of a run load them in a second instead of redoing them. The evaluation stream is the
    held-out files of the bundled model (its heldout_keys, in their order) when models/train_log.json
    is there, so the held-out windows are the old model's exactly (given the same tokenizer)."""
    meta_path = os.path.join(cache_dir, "data.json") if cache_dir else None
    if meta_path and os.path.exists(meta_path):
        t = time.time()
        with open(meta_path) as f:
            meta = json.load(f)
        d = {"meta": meta, "tok": Tokenizer.from_file(os.path.join(cache_dir, "tokenizer.json")),
             "tok_ids": meta["tok_ids"]}
        for name in ("train", "held", "eval"):
            d[name] = np.fromfile(os.path.join(cache_dir, f"{name}.bin"), dtype=np.int32)
        timings["data_cache_load_s"] = time.time() - t
        log(f"data from the cache in {cache_dir}: train {len(d['train'])} / held-out {len(d['held'])} / eval "
            f"{len(d['eval'])} tokens ({timings['data_cache_load_s']:.1f}s)")
        return d

    t = time.time()
    chosen, n_candidates, bytes_candidates = collect_files(int(args.data_mb * 1e6))
    train_files, held_files, skipped = read_texts(chosen, args.heldout_percent)
    n_short, bytes_before = 0, sum(len(x[1]) for x in train_files)
    if args.short_docstrings > 0:
        train_files, n_short = P.short_docstrings_all(train_files, args.short_docstrings)
        log(f"short docstrings in {n_short} of {len(train_files)} training files: "
            f"{bytes_before / 1e6:.1f} -> {sum(len(x[1]) for x in train_files) / 1e6:.1f} MB")
    train_bytes = sum(len(x[1]) for x in train_files)
    held_bytes = sum(len(x[1]) for x in held_files)
    timings["collect_s"] = time.time() - t
    log(f"data: {len(train_files)} train files ({train_bytes / 1e6:.1f} MB), {len(held_files)} held-out "
        f"({held_bytes / 1e6:.2f} MB), {skipped} skipped; {timings['collect_s']:.1f}s")
    if not train_files or not held_files:
        raise SystemExit("no data found")

    t = time.time()
    if args.tokenizer_gguf:
        tok, tok_ids = tokenizer_from_gguf(args.tokenizer_gguf, args.vocab)
        tok_train_bytes = 0
        log(f"tokenizer: {tok.get_vocab_size()} tokens from {args.tokenizer_gguf}")
    else:
        tok, tok_ids, tok_train_bytes = train_tokenizer([x[1] for x in train_files], args.vocab,
                                                        int(args.tok_train_mb * 1e6))
    timings["tokenizer_train_s"] = time.time() - t
    for p in PROMPTS[:3]:
        assert tok.decode(tok.encode(p, add_special_tokens=False).ids) == p, f"round trip failed for {p!r}"
    eot = tok_ids["<|endoftext|>"]

    t = time.time()
    train_stream = encode_stream(tok, [x[1] for x in train_files], eot)
    held_stream = encode_stream(tok, [x[1] for x in held_files], eot)
    old = old_model_heldout()
    eval_note = "all held-out files of this selection"
    eval_stream, eval_bytes = held_stream, sum(len(x[1].encode("utf-8")) for x in held_files)
    if old is not None:
        keys = set(old["keys"])
        sel = [x for x in held_files if x[0] in keys]
        if sel:
            eval_stream = encode_stream(tok, [x[1] for x in sel], eot)
            eval_bytes = sum(len(x[1].encode("utf-8")) for x in sel)
            eval_note = (f"the bundled model's held-out files ({len(sel)} of its {len(keys)} present, "
                         f"{len(eval_stream)} tokens; it had {old['tokens']})")
    timings["encode_s"] = time.time() - t
    log(f"encoded: train {len(train_stream)} tokens ({train_bytes / max(1, len(train_stream)):.2f} bytes/token), "
        f"held-out {len(held_stream)} tokens; evaluation stream: {eval_note}; {timings['encode_s']:.1f}s")
    assert train_stream.max() < args.vocab and held_stream.max() < args.vocab
    meta = {"candidate_files": n_candidates, "candidate_bytes": bytes_candidates, "chosen_files": len(chosen),
            "skipped_files": skipped, "train_files": len(train_files),
            "short_docstrings": {"share": args.short_docstrings, "files_changed": n_short,
                                 "train_bytes_before": bytes_before}, "heldout_files": len(held_files),
            "train_bytes": train_bytes, "heldout_bytes": held_bytes, "train_tokens": int(len(train_stream)),
            "heldout_tokens": int(len(held_stream)), "eval_tokens": int(len(eval_stream)),
            "eval_bytes": int(eval_bytes), "eval_stream": eval_note,
            "eval_same_tokens_as_bundled": (old is not None and len(eval_stream) == old["tokens"]),
            "heldout_rule": f"int(sha1('heldout:'+key)[:8], 16) % 100 < {args.heldout_percent}",
            "heldout_keys": sorted(k for k, _ in held_files), "tok_ids": tok_ids,
            "tok_train_bytes": tok_train_bytes, "tokenizer_from": args.tokenizer_gguf or "trained",
            "roots": source_roots()}
    d = {"meta": meta, "tok": tok, "tok_ids": tok_ids, "train": train_stream, "held": held_stream,
         "eval": eval_stream}
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        for name in ("train", "held", "eval"):
            d[name].astype(np.int32).tofile(os.path.join(cache_dir, f"{name}.bin"))
        tok.save(os.path.join(cache_dir, "tokenizer.json"))
        with open(meta_path + ".tmp", "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(meta_path + ".tmp", meta_path)  # written last: its presence means the cache is whole
    return d


def save_ckpt(ckpt_dir, state):
    path = os.path.join(ckpt_dir, "state.pt")
    t = time.time()
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    log(f"checkpoint: step {state['step']} saved to {path} ({os.path.getsize(path) / 1e6:.0f} MB, "
        f"{time.time() - t:.1f}s)")


def export_mtp(model, mtp, hf_dir, out_dir):
    """Adds the MTP head to hf/model.safetensors under the released checkpoints' names. Its decoder
    layer is saved by transformers itself (the trunk saved once more with the head's layer in place of
    a full-attention layer), so mtp.layers.0.* has exactly the trunk layers' on-disk layout (fused or
    per-expert, whichever this transformers writes); the predictor's own tensors are mtp.fc.weight,
    mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight and mtp.norm.weight.
    config.json gets mtp_num_hidden_layers = 1."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    import re

    idx = mtp.full_idx
    swap_dir = os.path.join(out_dir, ".mtp_swap")
    orig = model.model.layers[idx]
    model.model.layers[idx] = mtp.layers[0]
    try:
        model.save_pretrained(swap_dir)
    finally:
        model.model.layers[idx] = orig
    pat = re.compile(rf"^(.*?)layers\.{idx}\.(.+)$")
    st = os.path.join(hf_dir, "model.safetensors")
    tensors, trunk_layer = {}, {}
    with safe_open(st, framework="pt") as f:
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
            m = pat.match(k)
            if m:
                trunk_layer[m.group(2)] = tuple(tensors[k].shape)
    with safe_open(os.path.join(swap_dir, "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            m = pat.match(k)
            if m:
                tensors["mtp.layers.0." + m.group(2)] = f.get_tensor(k).contiguous()
    shutil.rmtree(swap_dir)
    mtp_layer = {k[len("mtp.layers.0."):]: tuple(v.shape) for k, v in tensors.items() if k.startswith("mtp.layers.0.")}
    assert mtp_layer == trunk_layer, f"MTP layer tensors differ from trunk layer {idx}: {mtp_layer} vs {trunk_layer}"
    sd = mtp.state_dict()
    for name in ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
        tensors["mtp." + name] = sd[name].detach().to(torch.bfloat16).contiguous().cpu()
    save_file(tensors, st, metadata={"format": "pt"})
    cfg_path = os.path.join(hf_dir, "config.json")
    with open(cfg_path) as f:
        cfgj = json.load(f)
    cfgj["mtp_num_hidden_layers"] = 1
    with open(cfg_path, "w") as f:
        json.dump(cfgj, f, indent=2, sort_keys=True)
        f.write("\n")
    names = sorted(k for k in tensors if k.startswith("mtp."))
    log(f"MTP head exported: {len(names)} tensors under mtp.* (layer from trunk layer {idx}'s layout)")
    return names


@torch.no_grad()
def mtp_prompt_reference(ref, mtp, box, tok, device):
    """Per prompt, the MTP head's top-5 at each row t (trunk hidden at t, prompt token t+1; predicts
    t+2): a fixture for checking another implementation of the head against this one."""
    out = []
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) < 2:
            continue
        x = torch.tensor([ids], device=device)
        ref(input_ids=x, use_cache=False)
        ml = mtp(box["h"], x, ref)[0].float()
        vals, idx = torch.topk(ml, 5, dim=-1)
        out.append({"prompt": text, "prompt_ids": ids,
                    "rows": [{"t": t, "next_token": ids[t + 1],
                              "top5": [[int(i), float(v)] for v, i in zip(vals[t].tolist(), idx[t].tolist())]}
                             for t in range(len(ids) - 1)]})
    return out


def heldout_record(loss, windows, meta, how):
    """Loss, perplexity and approximate bits per byte (stream-wide bytes/token of the evaluation
    files: comparable across tokenizers) on the evaluation windows."""
    bpt = meta["eval_bytes"] / max(1, meta["eval_tokens"])
    return {"loss": loss, "ppl": math.exp(loss), "bits_per_byte_approx": loss / math.log(2) / bpt,
            "windows": int(windows.shape[0]), "seq": int(windows.shape[1]), "tokens": int(windows.numel()),
            "how": how}


def profile_steps(model, opt, data_gpu, n_tokens, args, gen, device, use_autocast, use_aux, mtp, box, fast_fn, rope):
    """Time and profile a few training steps (where a step's time goes), without training a run."""
    import inspect
    from torch.profiler import ProfilerActivity, profile
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
    src = inspect.getsource(getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule))
    log(f"profile: chunked DeltaNet {'solves triangular systems' if 'solve_triangular' in src else 'substitutes row by row'}")
    step = lambda: train_step(model, opt, make_batch(data_gpu, n_tokens, args.batch, args.seq, gen, device),
                              use_autocast, use_aux, mtp, args.mtp_weight, box, args.aux_coef, fast_fn, rope)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = time.time()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    ms = (time.time() - t) * 100.0
    log(f"profile: {ms:.1f} ms/step ({args.batch * args.seq / ms:.0f}k tok/s) over 10 steps")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profile_steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    print(events.table(sort_by="self_cuda_time_total", row_limit=30), flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=12), flush=True)


def main():
    args = parse_args()
    budget_end = T0 + args.minutes * 60.0
    if not torch.cuda.is_available():
        raise SystemExit("CUDA is required (this script runs on the GPU machine)")
    device = torch.device("cuda")
    out_dir = os.path.abspath(args.out)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"{out_dir} exists and is not empty")
    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    run_plan = load_plan(args)
    ckpt_dir = os.path.abspath(args.ckpt) if args.ckpt else None
    shape = {k: getattr(args, k) for k in P.SHAPE_KEYS}
    size_line, est_size = P.describe(shape, args.vocab, args.quant, args.mtp)
    log(f"shape {shape}: {size_line}")

    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "numpy": np.__version__,
                "gpu": torch.cuda.get_device_name(0)}
    log("versions:", versions)
    log("fast-kernel packages installed (then blocked):", _FOUND)
    timings = {}

    # ---- 1-2. data, tokenizer, encoding (cached in the checkpoint folder) -------------------------
    data = prepare_data(args, ckpt_dir, timings)
    meta, tok, tok_ids = data["meta"], data["tok"], data["tok_ids"]
    train_stream, eval_stream = data["train"], data["eval"]
    save_tokenizer(tok, tok_ids, hf_dir)
    eot = tok_ids["<|endoftext|>"]
    log(f"tokenizer: {tok.get_vocab_size()} tokens ({meta['tokenizer_from']}), special ids {tok_ids}")

    # ---- 3. model --------------------------------------------------------------------------------
    from transformers import Qwen3_5MoeForCausalLM

    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True  # training speed; references turn it off below
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = False
    cfg = make_config(args, args.vocab, eot, "sdpa", "eager")
    model = Qwen3_5MoeForCausalLM(cfg).to(device)
    model.train()
    mtp = MtpHead(cfg).to(device).train() if args.mtp else None
    box = capture_final_hidden(model)[0] if mtp is not None else None
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters()) if mtp is not None else 0
    breakdown = param_breakdown(model)
    log(f"model: {n_params / 1e6:.2f}M parameters ({2 * n_params / 1e6:.1f} MB in bf16): {breakdown}"
        + (f"; MTP head {n_mtp / 1e6:.2f}M" if mtp is not None else ""))
    log(f"layer_types: {cfg.layer_types}")
    log(f"gated-DeltaNet functions: {gdn_functions()}")
    expect = P.count_params(shape, args.vocab, args.mtp)
    if n_params + n_mtp != expect:
        log(f"WARNING: {n_params + n_mtp} parameters, plan.py counts {expect}: the size estimate is off")
    if n_params > args.max_params:
        raise SystemExit(f"{n_params} parameters exceed --max-params {args.max_params:.0f}")
    if est_size > P.SIZE_CAP_BYTES:
        log(f"WARNING: the GGUF at {args.quant} would be {est_size / 1e6:.1f} MB, over the "
            f"{P.SIZE_CAP_BYTES / 1e6:.0f} MB cap of the repository file")

    decay, no_decay = [], []
    named = list(model.named_parameters()) + (list(mtp.named_parameters()) if mtp is not None else [])
    for name, p in named:
        (decay if p.ndim >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    data_gpu = torch.from_numpy(train_stream).to(device)
    n_train_tokens = len(train_stream)
    gen = torch.Generator().manual_seed(args.seed + 1)
    held_windows = eval_windows(eval_stream, args.seq, args.eval_windows)
    mid_windows = held_windows[:16]
    use_aux = args.aux_coef > 0

    state = None
    state_path = os.path.join(ckpt_dir, "state.pt") if ckpt_dir else None
    if args.resume and os.path.exists(state_path):
        t = time.time()
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        if mtp is not None:
            mtp.load_state_dict(state["mtp"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen_state"])
        torch.set_rng_state(state["torch_rng"])
        torch.cuda.set_rng_state(state["cuda_rng"])
        use_autocast, experts_impl = state["use_autocast"], state["experts_impl"]
        set_impl(model, experts=experts_impl)
        timings["ckpt_load_s"] = time.time() - t
        log(f"resumed at step {state['step']} of {run_plan['total_steps']} ({timings['ckpt_load_s']:.1f}s); "
            f"experts={experts_impl}, autocast={use_autocast}")
    else:
        if args.resume:
            log(f"no {state_path} yet: the first call stopped before its first save; starting at step 0")
        # Autocast and experts-implementation trials on one batch (deterministic batch, state restored).
        trial_x = make_batch(data_gpu, n_train_tokens, args.batch, args.seq, torch.Generator().manual_seed(7), device)
        use_autocast = True
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=trial_x, labels=trial_x, use_cache=False, output_router_logits=use_aux)
            out.loss.backward()
            model.zero_grad(set_to_none=True)
            log(f"autocast trial ok: loss {float(out.loss.detach()):.4f} (ln V = {math.log(args.vocab):.4f})")
        except Exception as e:
            log(f"bf16 autocast failed ({type(e).__name__}: {str(e)[:200]}); training in float32 (TF32)")
            use_autocast = False
            model.zero_grad(set_to_none=True)
        experts_impl = choose_experts_impl(model, trial_x, use_autocast)
        del trial_x
    if mtp is not None:
        mtp.set_experts(experts_impl)

    fast_fn, rope, fast_check = None, None, None
    if args.fast:
        check_x = make_batch(data_gpu, n_train_tokens, 2, args.seq, torch.Generator().manual_seed(11), device)
        fast_check = check_fast(model, mtp, box, check_x, use_aux, device)
        del check_x
        rope = fast.rotary(model, args.batch, args.seq, device)
        fast_fn = torch.compile(fast_losses) if args.compile else fast_losses
        log("training with fast.py's forward" + (" under torch.compile (the first steps compile)" if args.compile else ""))
    elif args.compile:
        sys.exit("--compile 1 needs --fast 1")
    if args.profile_steps:
        profile_steps(model, opt, data_gpu, n_train_tokens, args, gen, device, use_autocast, use_aux, mtp, box,
                      fast_fn, rope)
        return

    # ---- training loop ---------------------------------------------------------------------------
    train_deadline = budget_end - args.reserve_s
    log(f"training until t={train_deadline - T0:.0f}s (budget {args.minutes:.2f} min, reserve {args.reserve_s:.0f}s); "
        f"experts={experts_impl}, autocast={use_autocast}, aux={use_aux}, mtp={args.mtp}")
    if run_plan is not None:
        planned, warmup = run_plan["total_steps"], run_plan["warmup"]
    else:
        planned, warmup = args.steps, args.warmup
    step = state["step"] if state else 0
    start_step = step
    curve = state["curve"] if state else []
    held_curve = state["held_curve"] if state else []
    calls = state["calls"] if state else []
    train_s_before = state["train_s"] if state else 0.0
    measure_from, measure_to = start_step + 5, start_step + 25
    t_measure = None
    step_time = state.get("step_time") if state else None
    loss_acc = torch.zeros((), device=device)
    aux_acc = torch.zeros((), device=device)
    mtp_acc = torch.zeros((), device=device)
    acc_n = 0
    stop_reason = "planned steps done"
    mid_points = set()
    if planned is not None and run_plan is None:
        if planned < 4 * warmup:
            warmup = max(1, planned // 10)
        mid_points = {planned // 4, planned // 2, (3 * planned) // 4}
    del state

    def checkpoint_state():
        return {"step": step, "model": model.state_dict(), "mtp": mtp.state_dict() if mtp is not None else None,
                "opt": opt.state_dict(), "gen_state": gen.get_state(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(), "use_autocast": use_autocast, "experts_impl": experts_impl,
                "curve": curve, "held_curve": held_curve, "calls": calls, "step_time": step_time,
                "train_s": train_s_before + (time.time() - t_train)}

    def held_point(windows, label):
        hl = mean_loss(model, windows, device, 16, use_autocast)
        rec = {"step": step, "heldout_loss": hl, "heldout_ppl": math.exp(hl), "windows": int(windows.shape[0])}
        if mtp is not None:
            rec["mtp"] = mtp_eval(model, mtp, box, windows, device, 16, use_autocast)
        held_curve.append(rec)
        log(f"step {step}: held-out loss {hl:.4f} (ppl {math.exp(hl):.2f}) on {windows.shape[0]} windows ({label})"
            + (f"; MTP loss {rec['mtp']['loss']:.4f}, top-1 {rec['mtp']['top1_vs_data']:.3f}, agrees with the "
               f"trunk's arg-max {rec['mtp']['top1_vs_trunk_argmax']:.3f}" if mtp is not None else ""))

    t_train = time.time()
    while True:
        if planned is not None and step >= planned:
            break
        if time.time() > train_deadline:
            stop_reason = "time budget"
            break
        lr = lr_at(step, planned, warmup, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        x = make_batch(data_gpu, n_train_tokens, args.batch, args.seq, gen, device)
        loss, aux, gnorm, mloss = train_step(model, opt, x, use_autocast, use_aux, mtp, args.mtp_weight, box,
                                             args.aux_coef, fast_fn, rope)
        loss_acc += loss
        if aux is not None:
            aux_acc += aux
        if mloss is not None:
            mtp_acc += mloss
        acc_n += 1
        step += 1

        if step == measure_from:
            torch.cuda.synchronize()
            t_measure = time.time()
        if step == measure_to:
            torch.cuda.synchronize()
            step_time = (time.time() - t_measure) / (measure_to - measure_from)
            log(f"measured {step_time * 1000:.1f} ms/step ({args.batch * args.seq / step_time / 1e3:.0f}k tok/s)")
            if run_plan is not None and run_plan["total_steps"] is None:
                planned = max(step + 1, int(run_plan["train_minutes"] * 60.0 / step_time))
                run_plan["total_steps"] = planned
                run_plan["fixed_from_step_time"] = step_time
                write_plan(ckpt_dir, run_plan)
                log(f"planned steps: {planned} ({run_plan['train_minutes']} min at {step_time * 1000:.1f} ms/step, "
                    f"{planned * args.batch * args.seq / 1e6:.1f}M tokens), written to plan.json")
            elif planned is None:
                remaining = train_deadline - time.time()
                planned = step + max(0, int(0.96 * remaining / step_time))
                if planned < 4 * warmup:
                    warmup = max(1, planned // 10)
                mid_points = {planned // 4, planned // 2, (3 * planned) // 4}
                log(f"planned steps: {planned} (warmup {warmup}); rerun with --steps {planned} to repeat this run")
            if run_plan is not None:
                left = (planned - step) * step_time
                log(f"{planned - step} steps left: about {left / 60:.1f} min of training "
                    f"({left / max(1.0, train_deadline - time.time()):.2f} of this call's training time)")
        if step % 25 == 0 or (planned is not None and step == planned):
            mean = float(loss_acc) / acc_n
            mean_aux = float(aux_acc) / acc_n if use_aux else None
            mean_mtp = float(mtp_acc) / acc_n if mtp is not None else None
            rec = {"step": step, "loss": mean, "aux_loss": mean_aux, "lr": lr,
                   "grad_norm": float(gnorm), "elapsed_s": round(elapsed(), 1)}
            if mtp is not None:
                rec["mtp_loss"] = mean_mtp
            curve.append(rec)
            loss_acc.zero_()
            aux_acc.zero_()
            mtp_acc.zero_()
            acc_n = 0
            if step % 100 == 0:
                log(f"step {step}/{planned}: loss {mean:.4f} aux {mean_aux if mean_aux is None else round(mean_aux, 4)} "
                    + (f"mtp {mean_mtp:.4f} " if mean_mtp is not None else "")
                    + f"lr {lr:.2e} gnorm {float(gnorm):.3f}")
        if step in mid_points:
            held_point(mid_windows, "bf16 autocast")
        if ckpt_dir and step % args.ckpt_every == 0 and planned is not None and step < planned:
            held_point(held_windows, "checkpoint, bf16 autocast")
            save_ckpt(ckpt_dir, checkpoint_state())
    torch.cuda.synchronize()
    timings["train_s"] = time.time() - t_train
    log(f"training stopped after {step} steps ({stop_reason}); {step - start_step} steps in this call, "
        f"{timings['train_s']:.1f}s")
    if ckpt_dir:
        calls.append({"from_step": start_step, "to_step": step, "train_s": timings["train_s"],
                      "step_time": step_time, "stop_reason": stop_reason, "argv": sys.argv})
        if step > start_step or not os.path.exists(state_path):
            if not held_curve or held_curve[-1]["step"] != step:
                held_point(held_windows, "end of call, bf16 autocast")
            save_ckpt(ckpt_dir, checkpoint_state())
        if planned is None or step < planned:
            progress = {"step": step, "planned_steps": planned, "calls": calls, "heldout_curve": held_curve,
                        "loss_curve": curve[-40:], "timings_s": timings, "shape": shape, "size_estimate": size_line}
            with open(os.path.join(out_dir, "progress.json"), "w") as f:
                json.dump(progress, f, indent=1)
                f.write("\n")
            if args.pack:
                os.makedirs(args.pack, exist_ok=True)
                shutil.copyfile(os.path.join(out_dir, "progress.json"), os.path.join(args.pack, "progress.json"))
            log(f"run not finished ({step}/{planned} steps): continue with the same command plus --resume "
                f"(--ckpt {args.ckpt} --resume --out <new folder>); done in {elapsed():.1f}s")
            return
    train_s_total = train_s_before + timings["train_s"]
    del data_gpu, opt

    # ---- 4. bf16 export and references -----------------------------------------------------------
    t = time.time()
    model.eval()
    model.to(torch.bfloat16)
    model.config.use_cache = True
    model.save_pretrained(hf_dir)
    st = os.path.join(hf_dir, "model.safetensors")
    assert os.path.exists(st), f"no single model.safetensors in {os.listdir(hf_dir)}"
    mtp_names = []
    if mtp is not None:
        mtp.eval()
        mtp.to(torch.bfloat16)
        mtp_names = export_mtp(model, mtp, hf_dir, out_dir)
    from safetensors import safe_open
    stored = []
    with safe_open(st, framework="pt") as f:
        for k in sorted(f.keys()):
            s = f.get_slice(k)
            stored.append((k, list(s.get_shape()), s.get_dtype()))
    with open(os.path.join(out_dir, "hf_param_names.txt"), "w") as f:
        for k, shp, dt in stored:
            f.write(f"{k}\t{shp}\t{dt}\n")
    bf16_params = {k: v.detach().clone() for k, v in model.named_parameters()}
    del model
    torch.cuda.empty_cache()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ref = Qwen3_5MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(device).eval()
    impl = set_impl(ref, attn="eager", experts="eager")
    for k, p in ref.named_parameters():
        assert p.dtype == torch.float32, (k, p.dtype)
        assert torch.equal(p, bf16_params[k].float()), f"{k}: reloaded weights are not the bf16 values"
    del bf16_params
    mtp_final, mtp_ref = None, None
    log(f"reference model: float32 upcast of the saved bf16 weights, implementations {impl}, TF32 off; "
        f"saved checkpoint has {len(stored)} tensors ({os.path.getsize(st) / 1e6:.1f} MB)")

    # Held-out perplexity and routing counts (hooks on every router: output = (logits, weights, indices)).
    n_layers, n_exp, top_k = ref.config.num_hidden_layers, ref.config.num_experts, ref.config.num_experts_per_tok
    counts = torch.zeros(n_layers, n_exp, dtype=torch.long, device=device)
    hooks = []
    for li, layer in enumerate(ref.model.layers):
        def hook(mod, inp, out, li=li):
            if isinstance(out, tuple) and len(out) >= 3 and out[2].dtype in (torch.int64, torch.int32):
                idx = out[2]
            else:
                logits = out[0] if isinstance(out, tuple) else out
                idx = torch.topk(logits, top_k, dim=-1).indices
            assert idx.shape[-1] == top_k, idx.shape
            counts[li] += torch.bincount(idx.reshape(-1), minlength=n_exp)
        hooks.append(layer.mlp.gate.register_forward_hook(hook))
    held_loss = mean_loss(ref, held_windows, device, 16, use_autocast=False)
    for h in hooks:
        h.remove()
    counts_np = counts.cpu().numpy()
    n_eval_tokens = int(held_windows.numel())
    assert int(counts_np.sum()) == n_eval_tokens * n_layers * top_k, "routing counts do not add up"
    skew = routing_stats(counts_np)
    final_heldout = heldout_record(held_loss, held_windows, meta, "reference model (fp32 compute on bf16-rounded weights)")
    old = old_model_heldout()
    if old is not None:
        final_heldout["bundled_model"] = {
            "loss": old["loss"], "ppl": old["ppl"], "windows": old["windows"], "seq": old["seq"],
            "same_windows": bool(meta["eval_same_tokens_as_bundled"] and old["windows"] == held_windows.shape[0]
                                 and old["seq"] == args.seq and meta["tokenizer_from"] != "trained"),
            "note": "models/train_log.json final_heldout: same function, fp32 reference on bf16 weights"}
    if mtp is not None:
        mtp.float()  # the bf16-rounded values, exactly
        mtp.set_experts("eager")
        ref_box = capture_final_hidden(ref)[0]
        mtp_final = mtp_eval(ref, mtp, ref_box, held_windows, device, 16, use_autocast=False)
        mtp_ref = mtp_prompt_reference(ref, mtp, ref_box, tok, device)
        with open(os.path.join(out_dir, "mtp_reference.json"), "w") as f:
            json.dump({"what": "MTP head top-5 per row (trunk hidden at t after its norm, prompt token t+1; "
                               "predicts t+2), fp32 on the bf16 weights", "prompts": mtp_ref}, f, indent=1)
            f.write("\n")
        log(f"MTP head (reference fp32 on bf16 weights): loss {mtp_final['loss']:.4f}, top-1 vs data "
            f"{mtp_final['top1_vs_data']:.3f}, agrees with the trunk's arg-max {mtp_final['top1_vs_trunk_argmax']:.3f}")
    log(f"held-out (reference fp32 on bf16 weights): loss {held_loss:.4f}, ppl {math.exp(held_loss):.2f} "
        f"(~{final_heldout['bits_per_byte_approx']:.3f} bits/byte) over {held_windows.shape[0]} windows of {args.seq}")
    if "bundled_model" in final_heldout:
        b = final_heldout["bundled_model"]
        log(f"bundled model on {'the same' if b['same_windows'] else 'NOT provably the same'} windows: "
            f"loss {b['loss']:.4f}, ppl {b['ppl']:.2f}")
    log("routing skew (share of top-k assignments taken by the top "
        f"{skew['n_top_experts']} of {n_exp} experts; uniform = {skew['uniform_top20_share']:.3f}): "
        + ", ".join(f"L{r['layer']}={r['top20_share']:.3f}" for r in skew["per_layer"]))

    # Greedy references.
    refs, all_logits, row = [], [], 0
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        new, margins, top5, plog = greedy_manual(ref, ids, N_GREEDY, device)
        cached, cached_err = greedy_generate(ref, ids, N_GREEDY, device, eot)
        eos_at = new.index(eot) if eot in new else None
        # generate() stops at (or, with min_new_tokens, avoids) EOS: compare only the part before it.
        upto = eos_at if eos_at is not None else len(new)
        agrees = (cached[:upto] == new[:upto]) if cached is not None else None
        if cached_err:
            log(f"  note: HF generate() cross-check failed: {cached_err}")
        elif not agrees:
            log(f"  WARNING: HF cached generate() differs from the manual loop for {text[:30]!r}: {cached}")
        refs.append({
            "prompt": text,
            "prompt_ids": ids,
            "greedy_ids": new,
            "greedy_text": tok.decode(new, skip_special_tokens=False),
            "top1_margins": margins,
            "min_margin": min(margins),
            "top5": top5,
            "first_eos_index": eos_at,
            "hf_generate_cached_ids": cached,
            "hf_generate_agrees_before_eos": agrees,
            "logits_rows": [row, row + len(ids)],
        })
        all_logits.append(plog)
        row += len(ids)
        log(f"  prompt {text[:40]!r}: {len(ids)} ids -> {tok.decode(new)[:60]!r} (min margin {min(margins):.3f})")
    logits_cat = np.concatenate(all_logits, axis=0)
    assert logits_cat.shape == (row, args.vocab)
    logits_cat.astype("<f2").tofile(os.path.join(out_dir, "reference_logits.bin"))  # half: a small fixture
    timings["reference_s"] = time.time() - t

    # Tokenizer as transformers loads it (non-fatal cross-check).
    tok_check = {}
    try:
        from transformers import AutoTokenizer
        hft = AutoTokenizer.from_pretrained(hf_dir)
        tok_check["class"] = type(hft).__name__
        tok_check["encode_agrees"] = all(
            hft.encode(p, add_special_tokens=False) == tok.encode(p, add_special_tokens=False).ids for p in PROMPTS)
        tok_check["eos_token_id"] = hft.eos_token_id
        tok_check["chat_rendered"] = hft.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                             add_generation_prompt=True)
    except Exception as e:
        tok_check["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    log(f"AutoTokenizer check: {tok_check}")

    # ---- outputs ---------------------------------------------------------------------------------
    greedy_doc = {
        "what": "HF greedy continuations (manual argmax loop, full re-run each step, no cache) and logits",
        "weights": "bf16 checkpoint in hf/, upcast to float32 exactly",
        "compute": {"device": torch.cuda.get_device_name(0), "dtype": "float32", "tf32": False,
                    "attn_implementation": impl[0], "experts_implementation": impl[1],
                    "gdn_functions": gdn_functions()},
        "n_new_tokens": N_GREEDY,
        "eos_token_id": eot,
        "note": "greedy_ids always has n_new_tokens entries (generation does not stop at EOS); "
                "reference_logits.bin is float16 little-endian [sum of prompt lengths x vocab]; "
                "prompt p occupies rows logits_rows[0]..logits_rows[1]-1, row t = logits after prompt token t",
        "vocab_size": args.vocab,
        "prompts": refs,
    }
    with open(os.path.join(out_dir, "greedy_reference.json"), "w") as f:
        json.dump(greedy_doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out_dir, "routing_counts.json"), "w") as f:
        json.dump({"what": "top-k assignment counts per (layer, expert) on held-out data, reference model",
                   "tokens": n_eval_tokens, "top_k": top_k, "num_experts": n_exp,
                   "counts": counts_np.tolist(), "skew": skew}, f, indent=1)
        f.write("\n")
    log_doc = {
        "argv": sys.argv,
        "args": {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in vars(args).items()},
        "versions": versions,
        "fast_kernel_packages_installed": _FOUND,
        "fast_kernel_packages_blocked": list(_BLOCKED),
        "data": {k: v for k, v in meta.items() if k not in ("tok_ids", "tok_train_bytes", "tokenizer_from")},
        "tokenizer": {"vocab_size": tok.get_vocab_size(), "ids": tok_ids, "eos_token": EOS_TOKEN,
                      "split_regex": QWEN2_SPLIT_REGEX, "trained_on_bytes": meta["tok_train_bytes"],
                      "from": meta["tokenizer_from"], "transformers_check": tok_check},
        "model": {"class": "Qwen3_5MoeForCausalLM", "model_type": ref.config.model_type,
                  "n_params": n_params, "breakdown": breakdown, "layer_types": ref.config.layer_types,
                  "shape": shape, "preset": args.preset, "intended_quant": args.quant,
                  "gguf_size_estimate": size_line, "mtp_params": n_mtp, "mtp_tensors": mtp_names},
        "training": {"experts_implementation": experts_impl, "bf16_autocast": use_autocast,
                     "fast_forward": bool(args.fast), "fast_forward_check": fast_check, "compiled": bool(args.compile),
                     "aux_loss": use_aux, "measured_step_s": step_time, "planned_steps": planned,
                     "steps_done": step, "stop_reason": stop_reason, "warmup": warmup,
                     "tokens_seen": step * args.batch * args.seq,
                     "epochs": step * args.batch * args.seq / max(1, n_train_tokens),
                     "train_s_all_calls": train_s_total, "mtp": args.mtp, "mtp_weight": args.mtp_weight,
                     "run_plan": run_plan, "calls": calls},
        "loss_curve": curve,
        "heldout_curve_bf16_autocast": held_curve,
        "final_heldout": final_heldout,
        "final_mtp": mtp_final,
        "routing_skew": skew,
        "timings_s": timings,
    }
    timings["total_s"] = elapsed()
    with open(os.path.join(out_dir, "train_log.json"), "w") as f:
        json.dump(log_doc, f, indent=1)
        f.write("\n")
    write_summary(out_dir, log_doc, refs)
    log(f"outputs in {out_dir}: {sorted(os.listdir(out_dir))}, hf/: {sorted(os.listdir(hf_dir))}")

    if args.pack:
        pack_outputs(out_dir, args.pack, [os.path.join(out_dir, n) for n in
                                          ("summary.md", "train_log.json", "greedy_reference.json")])
    if ckpt_dir:
        log(f"checkpoint kept in {ckpt_dir} (resuming it again re-exports without training)")
    log(f"done in {elapsed():.1f}s (budget {args.minutes * 60:.0f}s)")


def write_summary(out_dir, d, refs):
    tr, fh, sk = d["training"], d["final_heldout"], d["routing_skew"]
    lines = [
        "## tiny-qwen35moe-py (trained by tools/train_tiny/train.py)",
        "",
        f"- Architecture: Qwen3_5MoeForCausalLM, {d['model']['n_params'] / 1e6:.2f}M parameters, "
        f"layers {d['model']['layer_types']}",
        f"- Data: {d['data']['train_files']} train files / {d['data']['heldout_files']} held-out files of Python "
        f"source from the GPU machine's stdlib and site-packages ({d['data']['train_tokens']} / "
        f"{d['data']['heldout_tokens']} tokens)",
        f"- Tokenizer: byte-level BPE, {d['tokenizer']['vocab_size']} tokens, Qwen2 split regex, eos "
        f"{d['tokenizer']['eos_token']}, ChatML template",
        f"- Training: {tr['steps_done']} steps ({tr['stop_reason']}), {tr['tokens_seen'] / 1e6:.1f}M tokens "
        f"({tr['epochs']:.2f} epochs), experts={tr['experts_implementation']}, bf16 autocast={tr['bf16_autocast']}, "
        f"{tr['measured_step_s']} s/step measured",
        f"- Held-out: loss {fh['loss']:.4f}, perplexity {fh['ppl']:.2f}, about "
        f"{fh.get('bits_per_byte_approx', float('nan')):.3f} bits per byte ({fh['tokens']} tokens; {fh['how']})",
    ]
    if "bundled_model" in fh:
        b = fh["bundled_model"]
        lines.append(f"- Bundled model before this one: loss {b['loss']:.4f}, perplexity {b['ppl']:.2f} "
                     f"({'same' if b['same_windows'] else 'not provably the same'} held-out windows)")
    if d.get("final_mtp"):
        m = d["final_mtp"]
        lines.append(f"- MTP head ({d['model']['mtp_params'] / 1e6:.2f}M parameters, loss weight "
                     f"{tr['mtp_weight']}): held-out loss {m['loss']:.4f} for token t+2, top-1 {m['top1_vs_data']:.3f}, "
                     f"agrees with the trunk's arg-max {m['top1_vs_trunk_argmax']:.3f}")
    if d["model"].get("gguf_size_estimate"):
        lines.append(f"- Size: {d['model']['gguf_size_estimate']}")
    lines += [
        "",
        "Loss curve (training loss, mean over the previous 25 steps):",
        "",
        "| step | loss | aux | lr |",
        "|---:|---:|---:|---:|",
    ]
    curve = d["loss_curve"]
    stride = max(1, len(curve) // 12)
    for c in curve[::stride] + ([curve[-1]] if curve and curve[-1] not in curve[::stride] else []):
        aux = "" if c["aux_loss"] is None else f"{c['aux_loss']:.4f}"
        lines.append(f"| {c['step']} | {c['loss']:.4f} | {aux} | {c['lr']:.2e} |")
    lines += [
        "",
        f"Routing skew on held-out data: share of top-k assignments taken by the top {sk['n_top_experts']} of "
        f"{sk['num_experts']} experts "
        f"(uniform = {sk['uniform_top20_share']:.3f}):",
        "",
        "| layer | top-20% share | max share | unused experts | entropy (bits) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in sk["per_layer"]:
        lines.append(f"| {r['layer']} | {r['top20_share']:.3f} | {r['max_share']:.3f} | {r['unused_experts']} | "
                     f"{r['entropy_bits']:.2f} |")
    lines += ["", "Greedy references (32 new tokens, HF fp32 on the bf16 weights):", ""]
    for r in refs:
        lines.append(f"- {r['prompt'][:50]!r} -> {r['greedy_text'][:80]!r} (min top-1 margin {r['min_margin']:.3f})")
    lines.append("")
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
