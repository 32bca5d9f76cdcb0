"""examples/moe_lm/train.py - a small Mixture-of-Experts transformer language model trained on real
text, with one of four expert layers (--moe):

  moex       moex.torch.MoELayer (router, top-k, permute, grouped SwiGLU MLP, unpermute; moex's
             operators forward and backward)
  moex_fp8   the same with fp8_recipe="block" (docs/ops.md 9.11: the expert GEMMs, forward and
             backward, on FP8 operands in DeepSeek-V3's 1x128 / 128x128 blocks; the weights'
             copies quantized once per step, is_first_microbatch=True)
  torch      the same layer in plain PyTorch, written as PyTorch users write it (Megatron's
             SequentialMLP, Hugging Face Mixtral): the tokens sorted by expert, then a loop of
             F.linear over the experts
  torch_gmm  the same, with the loop replaced by torch._grouped_mm (on CUDA: bf16 on Hopper)

All compute the same function (moex_fp8 up to FP8's rounding of the GEMMs' operands) with the same parameters (router_w [E, H], w1 [E, 2F, H],
w2 [E, H, F]; docs/ops.md section 8): f32 logits x Wr^T, softmax, top-k, the k probabilities
renormalised to sum 1; per chosen expert z = p * silu(a) * b with [a | b] = x W1^T (the
contiguous layout of docs/ops.md section 3: a, the activated half, first), y = sum of z W2^T.

The text: the licences in /usr/share/common-licenses (Debian's base-files package, on every
Debian and Ubuntu system; symbolic links skipped, they repeat other files), in sorted order,
as bytes (the vocabulary is the 256 byte values); the last 10% is held out for validation.
The model: byte and position embeddings, --layers pre-norm blocks (LayerNorm, causal
multi-head attention through F.scaled_dot_product_attention, LayerNorm, MoE layer), a final
LayerNorm and the output tied to the byte embedding. The loss: cross-entropy plus --aux-loss
times the Switch Transformer load-balancing loss (computed from the router weights outside
the MoE layer, the same for every variant). AdamW; in bf16 the model computes in bf16 and the
optimizer keeps f32 copies of the weights (Megatron's main params).

Every variant starts from the same weights (built under --seed on the CPU in f32, then moved
to --device and --dtype) and sees the same batches in the same order (also drawn under --seed).
In f32 every matrix product is computed in f32 (no TF32). --out gets a JSON: the configuration, the train loss of every step, the validation loss every --eval-every steps
and at the end, and ms per step over the steps after --warmup (validation not counted).

    python3 examples/moe_lm/train.py --moe moex --device cuda --out moex.json
    python3 examples/moe_lm/train.py --moe torch --device cpu --hidden 128 --ffn 256 --steps 100
"""
import argparse
import hashlib
import json
import math
import os
import pathlib
import time

import torch
import torch.nn.functional as F
from torch import nn

TEXT_DIR = "/usr/share/common-licenses"
VARIANTS = ("moex", "moex_fp8", "torch", "torch_gmm")


# ---- the text ----------------------------------------------------------------------------------

def load_text():
    """(train, val, info): the files of TEXT_DIR in sorted order, concatenated, as uint8
    tensors, the last 10% for validation; info says what was read."""
    names = sorted(n for n in os.listdir(TEXT_DIR) if not os.path.islink(os.path.join(TEXT_DIR, n)))
    data = b"".join(pathlib.Path(TEXT_DIR, n).read_bytes() for n in names)
    cut = len(data) * 9 // 10
    text = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    info = {"dir": TEXT_DIR, "files": names, "bytes": len(data), "train_bytes": cut,
            "val_bytes": len(data) - cut, "sha256": hashlib.sha256(data).hexdigest()}
    return text[:cut], text[cut:], info


# ---- the MoE layer in plain PyTorch --------------------------------------------------------------

def route(x, router_w, topk):
    """(probs [T, k] f32, ids [T, k]): softmax over the f32 logits x Wr^T, the k largest,
    renormalised to sum 1 (docs/ops.md section 5, SOFTMAX + RENORM)."""
    probs, ids = (x.float() @ router_w.float().t()).softmax(dim=-1).topk(topk, dim=-1)
    return probs / probs.sum(dim=-1, keepdim=True), ids


def scaled_swiglu(h, p):
    """z = p * silu(a) * b for the rows h = [a | b] (docs/ops.md section 3, contiguous layout),
    in f32 and rounded once to h's dtype, as moex does."""
    a, b = h.float().chunk(2, dim=-1)
    return (p[:, None] * F.silu(a) * b).to(h.dtype)


class TorchMoE(nn.Module):
    """moex.torch.MoELayer(E, H, F, topk, score="softmax", renorm=True) (SwiGLU, contiguous
    layout, no biases) in plain PyTorch: the parameters have the same names and shapes; the
    experts run as a loop of F.linear, or as torch._grouped_mm when grouped."""

    def __init__(self, num_experts, hidden, ffn, topk, grouped=False):
        super().__init__()
        self.topk, self.grouped = topk, grouped
        self.router_w = nn.Parameter(torch.empty(num_experts, hidden))
        self.w1 = nn.Parameter(torch.empty(num_experts, 2 * ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        E, k = self.w1.shape[0], self.topk
        probs, ids = route(x, self.router_w, k)
        expert = ids.flatten()                          # the T*k (token, choice) pairs
        order = expert.argsort(stable=True)             # sorted by expert
        token = order // k
        xs, ps = x[token], probs.flatten()[order]
        if self.grouped:
            # offs[e]: the end of expert e's rows in xs (searchsorted: no synchronisation with the GPU)
            offs = torch.searchsorted(expert[order], torch.arange(1, E + 1, device=x.device)).to(torch.int32)
            z = scaled_swiglu(torch._grouped_mm(xs, self.w1.transpose(-2, -1), offs=offs), ps)
            ys = torch._grouped_mm(z, self.w2.transpose(-2, -1), offs=offs)
        else:
            counts = torch.bincount(expert, minlength=E).tolist()  # waits for the GPU
            ys = torch.cat([F.linear(scaled_swiglu(F.linear(xe, w1), pe), w2) for xe, pe, w1, w2 in
                            zip(xs.split(counts), ps.split(counts), self.w1.unbind(0), self.w2.unbind(0))])
        return torch.zeros_like(x).index_add_(0, token, ys).reshape(shape)


def make_moe(variant, num_experts, hidden, ffn, topk):
    if variant in ("moex", "moex_fp8"):
        import moex.torch as mt  # only these variants need moex
        return mt.MoELayer(num_experts, hidden, ffn, topk, score="softmax", renorm=True,
                           fp8_recipe="block" if variant == "moex_fp8" else None)
    return TorchMoE(num_experts, hidden, ffn, topk, grouped=variant == "torch_gmm")


# ---- the model ---------------------------------------------------------------------------------

def load_balancing_loss(x, router_w, topk, mean_fraction=None):
    """The Switch Transformer auxiliary loss E * sum_e f_e P_e: f_e the fraction of the
    choices that go to expert e, P_e the mean router probability of e (1 when balanced).
    mean_fraction (train_ep.py): f averaged over the data-parallel ranks, so that f is the whole
    batch's and the ranks' losses average to the whole batch's."""
    E = router_w.shape[0]
    s = (x.reshape(-1, x.shape[-1]).float() @ router_w.float().t()).softmax(dim=-1)
    f = F.one_hot(s.topk(topk, dim=-1).indices, E).sum(dim=(0, 1)).float() / (s.shape[0] * topk)
    if mean_fraction is not None:
        f = mean_fraction(f)
    return E * (f * s.mean(dim=0)).sum()


class Block(nn.Module):
    """x + attention(norm(x)), then x + moe(norm(x)); also returns the load-balancing loss."""

    def __init__(self, args):
        super().__init__()
        H = args.hidden
        self.heads, self.topk = args.heads, args.topk
        self.norm1, self.norm2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.proj = nn.Linear(H, H, bias=False)
        self.moe = make_moe(args.moe, args.experts, H, args.ffn, args.topk)
        # FP8: the weights' copies made once per forward (docs/ops.md 9.11), read by its backward too
        self.moe_kwargs = {"is_first_microbatch": True} if args.moe == "moex_fp8" else {}
        self.mean_fraction = None   # (train_ep.py's, over its ranks)

    def forward(self, x):
        B, S, H = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, H))
        h = self.norm2(x)
        return x + self.moe(h, **self.moe_kwargs), load_balancing_loss(h, self.moe.router_w, self.topk,
                                                                       self.mean_fraction)


class MoELM(nn.Module):
    """A decoder-only byte-level transformer whose feed-forward layers are MoE layers."""

    def __init__(self, args):
        super().__init__()
        self.embed = nn.Embedding(256, args.hidden)
        self.pos = nn.Parameter(torch.zeros(args.seq, args.hidden))
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.layers))
        self.norm = nn.LayerNorm(args.hidden)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        """(logits [B, S, 256], the mean load-balancing loss of the layers)."""
        x = self.embed(tokens) + self.pos[:tokens.shape[1]]
        aux = 0.0
        for block in self.blocks:
            x, a = block(x)
            aux = aux + a
        return self.norm(x) @ self.embed.weight.t(), aux / len(self.blocks)


def build_model(args):
    """The model of args.moe, f32 on the CPU, with the weights of the plain PyTorch model
    built under args.seed (so that every variant starts from the same weights)."""
    torch.manual_seed(args.seed)
    start = MoELM(argparse.Namespace(**{**vars(args), "moe": "torch"}))
    model = start if args.moe == "torch" else MoELM(args)
    model.load_state_dict(start.state_dict())
    return model


# ---- training ----------------------------------------------------------------------------------

def lm_loss(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model, val, seq, batch, device):
    """The mean loss over every non-overlapping window of seq + 1 bytes of val."""
    n = (len(val) - 1) // seq
    xs, ys = val[:n * seq].view(n, seq), val[1:n * seq + 1].view(n, seq)
    total = 0.0
    for i in range(0, n, batch):
        x, y = xs[i:i + batch].to(device).long(), ys[i:i + batch].to(device).long()
        total += lm_loss(model(x)[0], y).item() * len(x)
    return total / n


def lr_at(step, args):
    """Linear warm-up over the first 10% of the steps, then cosine decay to lr / 10."""
    ramp = max(1, args.steps // 10)
    if step < ramp:
        return args.lr * (step + 1) / ramp
    t = (step - ramp) / max(1, args.steps - ramp)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def train(args, dp=None):
    """Trains args.moe's model; returns the record that --out gets. dp (train_ep.py's Ranks):
    data parallelism over its ranks, whose model (dp.model) has expert-parallel MoE layers: each
    rank takes its share of every batch, dp.reduce_grads makes the gradients the whole batch's,
    the losses are the ranks' means (dp.mean), and rank 0 prints; None: this one process."""
    name = args.moe if dp is None else dp.name
    device = torch.device(args.device) if dp is None else dp.device
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    if dtype == torch.float32:
        torch.set_float32_matmul_precision("highest")   # f32 products in f32, as moex computes them (no TF32)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    train_text, val_text, text_info = load_text()
    rank, world = (0, 1) if dp is None else (dp.rank, dp.world)

    model = build_model(args).to(device=device, dtype=dtype) if dp is None else dp.model(args, dtype)
    params = list(model.parameters())
    # In bf16 the optimizer updates f32 copies of the weights ("main params") and copies them back.
    main = params if dtype == torch.float32 else [p.detach().float() for p in params]
    groups = [{"params": [m for m in main if m.dim() >= 2], "weight_decay": 0.1},
              {"params": [m for m in main if m.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))

    # The batches: args.batch windows of seq + 1 bytes per step at offsets drawn under args.seed.
    gen = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(train_text) - args.seq, (args.steps, args.batch), generator=gen)
    share = args.batch // world   # (this rank's sequences of each batch)
    starts = starts[:, rank * share:(rank + 1) * share].to(device)
    window = torch.arange(args.seq + 1, device=device)
    text = train_text.to(device)

    losses = torch.zeros(args.steps, device=device)
    val_losses, timed_s, t0 = [], 0.0, 0.0
    for step in range(args.steps):
        if step == args.warmup:
            sync()
            t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        w = text[starts[step][:, None] + window].long()
        logits, aux = model(w[:, :-1])
        loss = lm_loss(logits, w[:, 1:])
        (loss + args.aux_loss * aux).backward()
        if dp is not None:
            dp.reduce_grads(model)
        if main is not params:
            for m, p in zip(main, params):
                m.grad, p.grad = p.grad.float(), None
        opt.step()
        opt.zero_grad(set_to_none=True)
        if main is not params:
            with torch.no_grad():
                torch._foreach_copy_(params, main)
        losses[step] = loss.detach() if dp is None else dp.mean(loss.detach())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            sync()
            if step >= args.warmup:
                timed_s += time.perf_counter() - t0
            model.eval()
            val_losses.append([step + 1, evaluate(model, val_text, args.seq, share, device)])
            model.train()
            if rank == 0:
                print(f"{name}: step {step + 1}/{args.steps}  train {losses[step].item():.4f}  "
                      f"val {val_losses[-1][1]:.4f}", flush=True)
            sync()
            t0 = time.perf_counter()

    timed = args.steps - args.warmup
    ms = 1e3 * timed_s / timed if timed > 0 else None
    return {
        "variant": name, "config": vars(args), "world": world, "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "params": sum(p.numel() for p in params), "text": text_info,
        "train_loss": losses.tolist(), "val_loss": val_losses,
        "timed_steps": timed, "ms_per_step": ms, "tokens_per_s": args.batch * args.seq / (ms / 1e3) if ms else None,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--moe", choices=VARIANTS, default="moex", help="the expert layer (default moex)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bf16", "f32"), help="default bf16 on CUDA, f32 on the CPU")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq", type=int, default=256, help="bytes per sequence")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--ffn", type=int, default=1024, help="each expert's FFN size F (w1 has 2F rows)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--aux-loss", type=float, default=0.01, help="weight of the load-balancing loss")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=50, help="steps between validation losses")
    p.add_argument("--warmup", type=int, default=20, help="steps run before the timing window")
    p.add_argument("--out", help="the JSON to write")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if torch.device(args.device).type == "cuda" else "f32"
    if args.hidden % args.heads:
        p.error("--hidden must be a multiple of --heads")
    return args


def main():
    args = parse_args()
    record = train(args)
    print(f"{record['variant']}: final train {record['train_loss'][-1]:.4f}  val {record['val_loss'][-1][1]:.4f}  "
          f"{record['ms_per_step']} ms/step")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
