"""Reference for model_test.go: the same GPT in PyTorch, differentiated by autograd.

usage: torch_gpt.py DIR
DIR holds config.json ({"layers", "d_model", "heads", "context", "vocab", "batch", "tensors":
[{"name", "shape", "offset"}...]}), params.bin (float32 little-endian, the flat buffer) and
tokens.bin (batch*(context+1) bytes). Writes loss.txt and grads.bin (float32, same layout).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
flat = torch.from_numpy(np.fromfile(os.path.join(d, "params.bin"), dtype="<f4").astype(np.float64))
tok = torch.from_numpy(np.fromfile(os.path.join(d, "tokens.bin"), dtype=np.uint8).astype(np.int64))
flat.requires_grad_(True)
P = {t["name"]: flat[t["offset"]:t["offset"] + math.prod(t["shape"])].view(*t["shape"]) for t in cfg["tensors"]}

B, T, D, H = cfg["batch"], cfg["context"], cfg["d_model"], cfg["heads"]
seq = tok.view(B, T + 1)
x = P["wte.weight"][seq[:, :T]] + P["wpe.weight"][torch.arange(T)]
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
for i in range(cfg["layers"]):
    p = lambda n: P[f"h.{i}.{n}"]
    a = F.layer_norm(x, (D,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
    q, k, v = F.linear(a, p("attn.c_attn.weight"), p("attn.c_attn.bias")).split(D, dim=2)
    q, k, v = [z.view(B, T, H, D // H).transpose(1, 2) for z in (q, k, v)]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, D)
    x = x + F.linear(y, p("attn.c_proj.weight"), p("attn.c_proj.bias"))
    a = F.layer_norm(x, (D,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
    h = F.gelu(F.linear(a, p("mlp.c_fc.weight"), p("mlp.c_fc.bias")), approximate="tanh")
    x = x + F.linear(h, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"))
x = F.layer_norm(x, (D,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
logits = x @ P["wte.weight"].t()
loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), seq[:, 1:].reshape(-1))
loss.backward()
open(os.path.join(d, "loss.txt"), "w").write(repr(loss.item()))
flat.grad.numpy().astype("<f4").tofile(os.path.join(d, "grads.bin"))
