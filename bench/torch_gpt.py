"""The embedded trainer's GPT in PyTorch (float32, CPU), trained the same way, for bench/trainer.sh.

The architecture is trainer/model's (and trainer/model/testdata/torch_gpt.py's): GPT-2 pre-LN over
bytes, learned positions, fused QKV with biases, GELU tanh, LayerNorm eps 1e-5, the output projection
tied to the token embedding. One optimizer step is global_batch sequences of context+1 bytes drawn at
random offsets of the corpus, run micro_batch at a time with the gradient accumulated (each micro
batch's loss scaled by micro/global), then clip_grad_norm_ and AdamW (weight decay on the 2-D tensors
only) with the trainer's warmup-then-cosine learning rate.

usage: torch_gpt.py --corpus FILE [--layers 2 --d-model 64 --heads 4 --context 64
                    --global-batch 32 --micro-batch 8 --steps 40 --skip 5 --threads 1]
Prints one JSON line: tokens_per_s over the steps after the first --skip, the first and last loss.
"""
import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, D = x.shape
        H = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = [z.view(B, T, H, D // H).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, context, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.register_buffer("mask", ~torch.tril(torch.ones(context, context, dtype=torch.bool)))
        for name, p in self.named_parameters():  # GPT-2's initialization, as model.Init
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, seq):
        T = seq.shape[1] - 1
        x = self.wte(seq[:, :T]) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x, self.mask[:T, :T])
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))


def lr_at(step, lr, min_lr, warmup, steps):
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= steps:
        return min_lr
    frac = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="steps left out of the timing (warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.global_batch % a.micro_batch or a.skip >= a.steps:
        raise SystemExit("torch_gpt.py: micro batch must divide global batch, and --skip be below --steps")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    corpus = np.fromfile(a.corpus, dtype=np.uint8)
    rng = np.random.default_rng(a.seed)
    window = a.context + 1
    model = GPT(a.layers, a.d_model, a.heads, a.context)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    accum = a.global_batch // a.micro_batch
    scale = a.micro_batch / a.global_batch
    losses = []
    t0 = None
    for step in range(a.steps):
        if step == a.skip:
            t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, 1e-2, 1e-3, 20, a.steps)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accum):
            offs = rng.integers(0, len(corpus) - window, size=a.micro_batch)
            seq = torch.from_numpy(np.stack([corpus[o:o + window] for o in offs]).astype(np.int64))
            loss = model(seq)
            (loss * scale).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(total / accum)
    dt = time.perf_counter() - t0
    tokens = (a.steps - a.skip) * a.global_batch * a.context
    print(json.dumps({"tokens_per_s": tokens / dt, "threads": a.threads, "torch": torch.__version__,
                      "params": sum(p.numel() for p in model.parameters()),
                      "loss_first": losses[0], "loss_last": losses[-1]}))


if __name__ == "__main__":
    main()
