"""torch_grouped_mm.py - the sm90 grouped GEMM entry points (forward, dgrad, wgrad) with their
tuning knobs against torch._grouped_mm on the same shapes, split values and tensors, for
kernel work (bench/gemm_bench.py is the benchmark of record, through the public API). The CUDA
configs of tools/bench_configs.h and its two small-group STUDY ones, bf16; GPU time as in
gemm_bench (the functions launched in rotating order, each behind a spin kernel that hides its
host time, each timed by its own CUDA events), medians reported.

  python3 torch_grouped_mm.py compare LIB OUT_DIR [CFG,CFG... [OP [VARIANT,VARIANT...]]]
      LIB: libmoex_sm90_bench.so (bench/CMakeLists.txt: build-gpu/bench/libmoex_sm90_bench.so),
      the tuned entry points of src/cuda/sm90_tuning.h; OP: fwd, dgrad or wgrad (default all three; wgrad against
      torch._grouped_mm(dy^T, x), 2d-2d, bf16 dW). Writes OUT_DIR/compare.jsonl and prints one
      table: per config, op, splits kind and variant, TFLOP/s of both sides, their ratio, and
      the relative error of the sm90 output against torch's. VARIANT: names of TUNES (default:
      the op's list in VARIANTS).
  python3 torch_grouped_mm.py pair LIB CFG OP KIND [VARIANT,VARIANT...]
      two rounds of one torch launch and one sm90 launch per variant (default: "default"),
      the second inside the NVTX range "profile", for a profiler (scripts/profile_pair.sh).

Skewed splits are Dirichlet(0.5) with one empty group (make_splits of bench/gemm_bench.py).
"""
import ctypes
import json
import sys

from gemm_bench import Spinner, bench_interleaved, make_splits   # the same splits and timing as the benchmark of record

from configs import select   # tools/bench_configs.h, the one list of benchmark configs

# the CUDA configs, then the STUDY ones: small groups (T < 128 G picks 64-row tiles), 64 and 32 rows a group
CONFIGS = [(c.name, c.G, c.T, c.K, c.N) for c in select("CUDA", "STUDY").values()]

# name -> (grid, band, epilogue_tma, cluster, grid_used, tile_rows, band_rows[, stream_k, l2_promotion]);
# 0 = the library default
TUNES = {
    "default": (0, 0, 1, 0, 0, 0, 0), "nocl": (0, 0, 1, 1, 0, 0, 0), "clu2": (0, 0, 1, 2, 0, 0, 0),
    "rows64": (0, 0, 1, 0, 0, 64, 0), "rows128": (0, 0, 1, 0, 0, 128, 0),
    "blkall": (0, 0, 1, 0, 0, 0, 1 << 20), "blk1024": (0, 0, 1, 0, 0, 0, 1024), "bandall": (0, 1 << 20, 1, 0, 0, 0, 0),
    # tile orders: columns fastest over the whole width (CUTLASS "along N"), rows fastest in
    # one column (along M), and narrower or wider bands
    "alongn": (0, 1 << 20, 1, 0, 0, 0, 1), "alongm": (0, 1, 1, 0, 0, 0, 1 << 20),
    "b4all": (0, 4, 1, 0, 0, 0, 1 << 20), "b16r1k": (0, 16, 1, 0, 0, 0, 1024), "b2all": (0, 2, 1, 0, 0, 0, 1 << 20),
    # without stream-K for the last round (forward, dgrad); tensor maps with 128-byte or no L2 promotion
    "nosk": (0, 0, 1, 0, 0, 0, 0, 1, 0), "sk": (0, 0, 1, 0, 0, 0, 0, 2, 0), "l2p128": (0, 0, 1, 0, 0, 0, 0, 0, 128), "l2pnone": (0, 0, 1, 0, 0, 0, 0, 0, 1),
}
# op -> the variants compare runs by default
VARIANTS = {
    "fwd": ["default", "nocl", "rows64", "rows128", "blkall", "blk1024"],
    "dgrad": ["default", "nocl", "rows64", "rows128", "blkall", "blk1024"],
    "wgrad": ["default", "clu2", "bandall"],
}
OPS = [o for o in sys.argv[5:6] if o in VARIANTS] or list(VARIANTS)
ONLY_VARIANTS = sys.argv[6].split(",") if len(sys.argv) > 6 else None   # compare ... OP VARIANT,VARIANT

MOEX_DTYPE_BF16 = 1


class Args(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("G", ctypes.c_int64), ("T", ctypes.c_int64), ("K", ctypes.c_int64),
                ("N", ctypes.c_int64), ("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("splits", ctypes.c_void_p), ("bad_flag", ctypes.c_void_p), ("bad_value", ctypes.c_int),
                ("workspace", ctypes.c_void_p), ("w_ptrs", ctypes.c_void_p), ("w_maps", ctypes.c_void_p),
                ("bad_align_value", ctypes.c_int), ("w_maps_kept", ctypes.c_void_p)]


class WArgs(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("G", ctypes.c_int64), ("T", ctypes.c_int64), ("K", ctypes.c_int64),
                ("N", ctypes.c_int64), ("dy", ctypes.c_void_p), ("x", ctypes.c_void_p), ("dw", ctypes.c_void_p),
                ("dw_dtype", ctypes.c_int), ("accumulate", ctypes.c_int), ("splits", ctypes.c_void_p),
                ("bad_flag", ctypes.c_void_p), ("bad_value", ctypes.c_int)]


class Tune(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_int), ("band", ctypes.c_int), ("epilogue_tma", ctypes.c_int),
                ("cluster", ctypes.c_int), ("grid_used", ctypes.c_int), ("tile_rows", ctypes.c_int),
                ("band_rows", ctypes.c_int), ("stream_k", ctypes.c_int), ("l2_promotion", ctypes.c_int)]


def bench(torch, fn, iters, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def load_entries(lib_path):
    """The three tuned sm90 entry points of libmoex_sm90_bench.so at lib_path (bench/sm90_bench_shim.c),
    typed for ctypes and bound to a Hopper context of device 0, and the stream-K workspace size."""
    lib = ctypes.CDLL(lib_path)
    lib.moex_sm90_bench_context_create.restype = ctypes.c_int
    lib.moex_sm90_bench_context_create.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                                   ctypes.POINTER(ctypes.c_char_p)]
    ctx, why = ctypes.c_void_p(), ctypes.c_char_p()
    sizes = [ctypes.c_size_t() for _ in range(3)]
    lib.moex_sm90_bench_struct_sizes(*map(ctypes.byref, sizes))
    for mirror, size in zip((Args, WArgs, Tune), sizes):   # a stale mirror would make the library read past it
        if ctypes.sizeof(mirror) != size.value:
            raise RuntimeError(f"{mirror.__name__}: {ctypes.sizeof(mirror)} bytes, the library's struct {size.value}")
    if lib.moex_sm90_bench_context_create(0, ctypes.byref(ctx), ctypes.byref(why)) != 0:
        raise RuntimeError(f"sm90 context: {why.value}")
    entry = {}
    for op, f in (("fwd", lib.moex_sm90_bench_fwd), ("dgrad", lib.moex_sm90_bench_dgrad),
                  ("wgrad", lib.moex_sm90_bench_wgrad)):
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(WArgs if op == "wgrad" else Args), ctypes.POINTER(Tune),
                      ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]
        entry[op] = lambda *a, f=f: f(ctx, *a)
    ws = lib.moex_sm90_bench_workspace_bytes
    ws.restype, ws.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    entry["ws_bytes"] = lambda: ws(ctx)
    return entry


class Problem:
    """One op of one config: tensors, split values, torch's call (tfn) and the sm90 call (run)
    writing self.y. x is the op's input ([T, K] forward, dy [T, N] dgrad and wgrad)."""

    def __init__(self, torch, entry, op, G, T, K, N, kind, w):
        dev = "cuda"
        self.torch, self.op, self.entry = torch, op, entry[op]
        nws = entry["ws_bytes"]()
        self.ws = torch.empty(nws, device=dev, dtype=torch.uint8) if nws else None
        iw, ow = (K, N) if op == "fwd" else (N, K)
        self.x = torch.randn(T, iw, device=dev, dtype=torch.bfloat16)
        self.y = torch.empty(T, ow, device=dev, dtype=torch.bfloat16)
        self.sd = torch.tensor(make_splits(G, T, kind), device=dev, dtype=torch.int64)
        offs = self.sd.cumsum(0).to(torch.int32)
        self.flops = 2 * T * K * N
        if op == "wgrad":   # x = dy [T, N], xk = x [T, K], y = dW [G, N, K]
            self.xk = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
            self.y = torch.empty(G, N, K, device=dev, dtype=torch.bfloat16)
            self.tfn = lambda: torch._grouped_mm(self.x.t(), self.xk, offs=offs)
            self.args = WArgs(MOEX_DTYPE_BF16, G, T, K, N, self.x.data_ptr(), self.xk.data_ptr(),
                              self.y.data_ptr(), MOEX_DTYPE_BF16, 0, self.sd.data_ptr())
        else:
            wb = w.transpose(-2, -1) if op == "fwd" else w
            self.tfn = lambda: torch._grouped_mm(self.x, wb, offs=offs)
            self.args = Args(MOEX_DTYPE_BF16, G, T, K, N, self.x.data_ptr(), w.data_ptr(), self.y.data_ptr(),
                             self.sd.data_ptr(), None, 0, self.ws.data_ptr() if self.ws is not None else None)

    def run(self, tune):
        why = ctypes.c_char_p()
        st = self.entry(ctypes.byref(self.args), ctypes.byref(tune),
                        ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream), ctypes.byref(why))
        if st != 0:
            raise RuntimeError(f"sm90 status {st}: {why.value}")


def compare(lib_path, out_dir, only):
    import torch
    entry = load_entries(lib_path)
    torch.manual_seed(0)
    dev = "cuda"
    spinner = Spinner(torch)
    print("torch", torch.__version__, torch.cuda.get_device_name(), "cuda", torch.version.cuda, flush=True)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = bench(torch, lambda: a @ b, 20)
    print(f"ceiling dense bf16 8192^3: {2 * 8192 ** 3 / t / 1e9:.0f} TFLOP/s", flush=True)
    del a, b
    rows = []
    hdr = (f"{'config':<14} {'op':<5} {'splits':<8} {'variant':<8} {'grid':>4} {'torch TF':>9} {'sm90 TF':>9} "
           f"{'ratio':>6} {'relerr':>8}")
    with open(f"{out_dir}/compare.jsonl", "w") as fj:
        for name, G, T, K, N in CONFIGS:
            if only and name not in only:
                continue
            w = torch.randn(G, N, K, device=dev, dtype=torch.bfloat16) * 0.02
            iters = 30 if K * N >= 2 ** 24 else 60
            for op in OPS:
                for kind in ("balanced", "skewed"):
                    pb = Problem(torch, entry, op, G, T, K, N, kind, w)
                    ref = pb.tfn()
                    variants = ONLY_VARIANTS or VARIANTS[op]
                    tunes = {v: Tune(*TUNES[v]) for v in variants}
                    fns = {"torch": pb.tfn}
                    for v in variants:
                        fns[v] = lambda v=v: pb.run(tunes[v])
                    ms = bench_interleaved(torch, spinner, fns, iters)
                    tt = {n: pb.flops / m / 1e9 for n, m in ms.items()}
                    for v in variants:
                        pb.y.fill_(float("nan"))
                        pb.run(tunes[v])
                        torch.cuda.synchronize()
                        relerr = float((pb.y.float() - ref.float()).norm() / ref.float().norm())
                        r = {"cfg": name, "op": op, "kind": kind, "variant": v, "grid": tunes[v].grid_used,
                             "torch_tflops": tt["torch"], "sm90_tflops": tt[v],
                             "ratio": tt[v] / tt["torch"], "relerr_vs_torch": relerr}
                        fj.write(json.dumps(r) + "\n")
                        rows.append(f"{name:<14} {op:<5} {kind:<8} {v:<8} {tunes[v].grid_used:>4} "
                                    f"{tt['torch']:>9.0f} {tt[v]:>9.0f} {r['ratio']:>6.3f} {relerr:>8.1e}")
                        print(rows[-1], flush=True)
                    del pb, ref
            del w
            torch.cuda.empty_cache()
    print("\nTF = TFLOP/s from the median of interleaved launches; ratio = sm90 / torch; "
          "relerr: sm90 output vs torch output")
    print(hdr)
    for r in rows:
        print(r)


def pair(lib_path, cfg, op, kind, variants, rounds=2):
    """torch's kernel and the sm90 kernel in each variant, one launch each per round,
    synchronised; the last round inside the NVTX range "profile" (ncu --nvtx --nvtx-include
    "profile/"), launches in the order torch, variants."""
    import torch
    entry = load_entries(lib_path)
    torch.manual_seed(0)
    name, G, T, K, N = next(c for c in CONFIGS if c[0] == cfg)
    w = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    pb = Problem(torch, entry, op, G, T, K, N, kind, w)
    tunes = [Tune(*TUNES[v]) for v in variants]
    for r in range(rounds):
        if r == rounds - 1:
            torch.cuda.nvtx.range_push("profile")
        pb.tfn()
        torch.cuda.synchronize()
        for tune in tunes:
            pb.run(tune)
            torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"pair {cfg} {op} {kind}: {rounds} rounds, variants {','.join(variants)}, "
          f"grids {','.join(str(t.grid_used) for t in tunes)}")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4].split(",") if len(sys.argv) > 4 else [])
    elif len(sys.argv) in (6, 7) and sys.argv[1] == "pair":
        pair(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6].split(",") if len(sys.argv) == 7 else ["default"])
    else:
        print(__doc__)
        sys.exit(2)
