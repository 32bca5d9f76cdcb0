#!/usr/bin/env bash
# compare_builds.sh - an old build of moex against a new one, in one run on one machine, so
# that both see the same GPU, clocks and load:
#   gemm  bench/gemm_bench.py --lib NEW/libmoex.so --lib-baseline OLD/libmoex.so: both
#         libraries' grouped GEMMs (fwd, dgrad, wgrad, fwd_bias, fwd_sbias; balanced and
#         skewed splits) timed in the same rotation of launches, medians of 30-60 each;
#   mlp   `moex bench --ops gemm` of each build (its rows mlp_fwd, mlp_fwd_bwd: the grouped
#         MLP forward, and forward + backward; and cli_fwd, cli_dgrad, cli_wgrad: the grouped
#         linear through each build's own CLI, for builds whose public structs differ, which
#         gemm_bench.py cannot load side by side), balanced and skewed splits;
#   moe   `moex bench --ops other` of each build (its rows moe_fwd, moe_bwd: the MoE layer);
#   fp8   each tree's own bench/fp8_bench.py (its Python package, its build's libmoex.so):
#         the FP8 grouped linear forward and weight gradient, GROUP and BLOCK scaling
#         (rows fp8_fwd_group, fp8_fwd_block, fp8_wgrad_group, fp8_wgrad_block; balanced
#         splits), and bench/moe_fp8_bench.py: the MoE layer's forward + backward, bf16 and
#         FP8 BLOCK (rows moe_layer_bf16, moe_layer_fp8; the layer configs of --moe-configs
#         read as moe_fp8_bench's dsv3, qwen3-30b, ...); needs --old-src;
#   ep    each build's moex_ep_bench under mpirun on every GPU of the machine (at least 2):
#         the EP dispatch (bf16 and FP8) and combine, PEER and CAPACITY transfers (rows
#         ep_dispatch_peer, ep_dispatch_peer-fp8, ...; GB/s in the old and new columns); needs
#         NCCL and MPI in both builds.
# For mlp, moe, fp8 and ep the two builds' invocations alternate (old new, new old, ...),
# --reps of each, and the median of each build's rates is taken. Last, one table: config,
# splits, op, old and new TFLOP/s, new/old (speed), and "SLOWER" on every row below 0.99.
#
# Usage: scripts/compare_builds.sh [options] OLD_BUILD NEW_BUILD
#   OLD_BUILD, NEW_BUILD  build directories, each with libmoex.so and the moex CLI (built with
#                         CUDA; with --cpu, any build)
#   --cpu                 the reduced mode, for a machine without a GPU: the CPU backend,
#                         gemm_bench.py --cpu, config tiny, 3 reps of 3 iterations
#   --configs A,B,...     configs of gemm and mlp (default: the CUDA set of tools/bench_configs.h)
#   --moe-configs A,B,... configs of moe (default: dsv3-fc1,qwen3-30b-fc1, as scripts/gpu_check.sh)
#   --reps N              invocations of each build per config and splits (default 3)
#   --iters N             timed runs per `moex bench` invocation (default 20; --cpu 3)
#   --parts P,...         which of gemm, mlp, moe, fp8, ep (default gemm, mlp, moe)
#   --old-src DIR         the old tree's checkout (fp8: its python/ and bench/; the new tree is
#                         this one)
#   --out DIR             logs, JSON and the table compare.txt (default $OUT, else a new
#                         directory under /tmp)
# With the defaults on one H200 it takes about 6-8 minutes (gemm about 3, mlp 72 and moe 12
# invocations of a few seconds each); to stay within a 10-minute limit per command, run
# `--parts gemm` and `--parts mlp,moe` as two commands. Exit status: 0, or 1 when a run failed
# (its rows say n/a) or gemm_bench found a wrong result; 2 on a bad command line.
set -u
cd "$(dirname "$0")/.." || exit 2

usage() { sed -n '2,/^set -u/{/^set -u/!s/^# \{0,1\}//p}' "$0"; }
die() { echo "compare_builds: $*" >&2; exit 2; }

CPU=0 REPS=3 ITERS='' PARTS=gemm,mlp,moe CONFIGS='' MOE_CONFIGS='' OUTDIR=${OUT:-} OLD_SRC=
ARGS=()
while [ $# -gt 0 ]; do
    case $1 in
        --cpu) CPU=1 ;;
        --configs) CONFIGS=${2:?}; shift ;;
        --moe-configs) MOE_CONFIGS=${2:?}; shift ;;
        --reps) REPS=${2:?}; shift ;;
        --iters) ITERS=${2:?}; shift ;;
        --parts) PARTS=${2:?}; shift ;;
        --old-src) OLD_SRC=${2:?}; shift ;;
        --out) OUTDIR=${2:?}; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) ARGS+=("$1") ;;
    esac
    shift
done
[ ${#ARGS[@]} -eq 2 ] || die "usage: scripts/compare_builds.sh [options] OLD_BUILD NEW_BUILD (--help: the options)"
OLD=${ARGS[0]} NEW=${ARGS[1]}
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "--reps takes a positive integer"
[ -z "$ITERS" ] || [[ $ITERS =~ ^[1-9][0-9]*$ ]] || die "--iters takes a positive integer"
for p in ${PARTS//,/ }; do [[ " gemm mlp moe fp8 ep " == *" $p "* ]] || die "unknown part $p (gemm, mlp, moe, fp8, ep)"; done
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if has fp8; then [ -f "$OLD_SRC/bench/fp8_bench.py" ] || die "the fp8 part needs --old-src, the old tree's checkout"; fi
if [ $CPU -eq 1 ]; then
    BACKEND=cpu SET=CPU CONFIGS=${CONFIGS:-tiny} MOE_CONFIGS=${MOE_CONFIGS:-tiny} ITERS=${ITERS:-3} GEMM_MODE=--cpu
else
    BACKEND=cuda SET=CUDA MOE_CONFIGS=${MOE_CONFIGS:-dsv3-fc1,qwen3-30b-fc1} ITERS=${ITERS:-20} GEMM_MODE=
fi
# the config names: those of the set (CPU or CUDA) of tools/bench_configs.h, through bench/configs.py
known=$(python3 -c 'import sys; sys.path.insert(0, "bench"); import configs; print(",".join(configs.select(sys.argv[1])))' \
        "$SET") || die "cannot read the configs (bench/configs.py)"
CONFIGS=${CONFIGS:-$known}
for c in ${CONFIGS//,/ } ${MOE_CONFIGS//,/ }; do
    [[ ",$known," == *",$c,"* ]] || die "unknown config $c (the $SET set of tools/bench_configs.h: $known)"
done

# Each build's CLI must load its own library: LD_LIBRARY_PATH picks it (the build tree's
# RUNPATH may name a directory that moved); ldd tells where it resolves.
for b in "$OLD" "$NEW"; do
    if [ ! -f "$b/libmoex.so" ] || [ ! -x "$b/moex" ]; then die "$b: no libmoex.so and moex (a build directory?)"; fi
    if command -v ldd > /dev/null; then
        lib=$(LD_LIBRARY_PATH="$b" ldd "$b/moex" | awk '/libmoex/ {print $3}')
        [ "$(dirname "$(realpath "$lib")")" = "$(realpath "$b")" ] ||
            die "$b/moex loads ${lib:-no libmoex}, not the library of its build"
    fi
done

if [ -z "$OUTDIR" ]; then OUTDIR=$(mktemp -d /tmp/compare_builds.XXXXXX); fi
mkdir -p "$OUTDIR/cli" || die "cannot create $OUTDIR"
failed=0
t_all=$SECONDS
{
    echo "compare_builds $(date -u +%FT%TZ) backend $BACKEND, parts $PARTS, reps $REPS, iters $ITERS"
    for w in old new; do
        b=$OLD; [ "$w" = new ] && b=$NEW
        echo "$w: $b: $(LD_LIBRARY_PATH="$b" "$b/moex" --version | head -1), libmoex.so sha256 $(sha256sum "$b/libmoex.so" | cut -c1-16)"
    done
    cmp -s "$OLD/libmoex.so" "$NEW/libmoex.so" && echo "(the two libmoex.so are the same file content: an A/A run)"
} | tee "$OUTDIR/builds.txt"

if has gemm; then
    t0=$SECONDS
    echo "gemm: bench/gemm_bench.py $GEMM_MODE on $CONFIGS ..."
    # shellcheck disable=SC2086  # GEMM_MODE: empty or one word
    PYTHONUNBUFFERED=1 python3 bench/gemm_bench.py $GEMM_MODE --lib "$NEW/libmoex.so" --lib-baseline "$OLD/libmoex.so" \
        --configs "$CONFIGS" --out "$OUTDIR" --json "$OUTDIR/gemm_bench.jsonl" > "$OUTDIR/gemm_bench.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { failed=1; echo "gemm: gemm_bench.py exited $rc (see $OUTDIR/gemm_bench.log):"; tail -5 "$OUTDIR/gemm_bench.log"; }
    grep -h '^no numpy' "$OUTDIR/gemm_bench.log" | sed 's/^/gemm: /'
    echo "gemm: $((SECONDS - t0)) s"
fi

# cli OPS CONFIG SPLITS: REPS invocations of each build, alternating, into cli/*.json
cli() {
    local ops=$1 cfg=$2 sp=$3 rep w b f rc sargs=()
    [ "$sp" = default ] || sargs=(--splits "$sp")
    for rep in $(seq 1 "$REPS"); do
        for w in $( [ $((rep % 2)) -eq 1 ] && echo old new || echo new old ); do
            b=$OLD; [ "$w" = new ] && b=$NEW
            f="$OUTDIR/cli/$ops.$cfg.$sp.$w.$rep"
            LD_LIBRARY_PATH="$b" "$b/moex" bench --backend "$BACKEND" --ops "$ops" --config "$cfg" "${sargs[@]}" \
                --iters "$ITERS" --json > "$f.json" 2> "$f.err"
            rc=$?
            if [ $rc -ne 0 ]; then
                failed=1
                echo "  $w moex bench --ops $ops --config $cfg ${sargs[*]} exited $rc: $(head -c 300 "$f.err")"
            fi
        done
    done
}
if has mlp; then
    t0=$SECONDS
    for cfg in ${CONFIGS//,/ }; do
        for sp in balanced skewed; do cli gemm "$cfg" "$sp"; done
        echo "mlp: $cfg done ($((SECONDS - t0)) s)"
    done
fi
if has moe; then
    t0=$SECONDS
    for cfg in ${MOE_CONFIGS//,/ }; do
        cli other "$cfg" default
        echo "moe: $cfg done ($((SECONDS - t0)) s)"
    done
fi

# alternate NAME CMD...: REPS runs of CMD for each build, alternating; CMD sees $w (old or
# new), $b (its build) and $src (its tree) and writes $f (the run's output file stem).
alternate() {
    local name=$1 rep rc; shift
    for rep in $(seq 1 "$REPS"); do
        for w in $( [ $((rep % 2)) -eq 1 ] && echo old new || echo new old ); do
            b=$OLD src=$OLD_SRC; [ "$w" = new ] && b=$NEW src=$PWD
            f="$OUTDIR/runs/$name.$w.$rep"
            "$@" > "$f.out" 2> "$f.err"
            rc=$?
            [ $rc -eq 0 ] || { failed=1; echo "  $w $name exited $rc: $(tail -c 300 "$f.err")"; }
        done
    done
}
fp8_linear() {
    PYTHONPATH="$src/python:$src/bench" MOEX_LIBRARY="$b/libmoex.so" MOEX_TORCH_EXTENSION= \
        python3 "$src/bench/fp8_bench.py" --configs "$CONFIGS" --splits balanced --iters "$ITERS" --product "$1"
}
fp8_layer() {
    PYTHONPATH="$src/python:$src/bench" MOEX_LIBRARY="$b/libmoex.so" MOEX_TORCH_EXTENSION= \
        python3 "$src/bench/moe_fp8_bench.py" --configs "$1" --recipes block --iters "$ITERS"
}
ep_bench() {
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$NGPU" -x NCCL_NVLS_ENABLE=0 \
        -x LD_LIBRARY_PATH="$b:${LD_LIBRARY_PATH:-}" "$b/bench/moex_ep_bench" --transfer "$1" --no-graph
}
mkdir -p "$OUTDIR/runs"
if has fp8; then
    t0=$SECONDS
    for product in forward wgrad; do alternate "fp8_$product" fp8_linear "$product"; done
    layers=$(echo "$MOE_CONFIGS" | sed 's/-fc[12]//g')
    alternate fp8_layer fp8_layer "$layers"
    echo "fp8: $((SECONDS - t0)) s"
fi
if has ep; then
    t0=$SECONDS
    NGPU=$(nvidia-smi -L | wc -l)
    [ "$NGPU" -ge 2 ] || { failed=1; echo "ep: $NGPU GPU(s): the ep part needs 2 or more"; }
    for b in "$OLD" "$NEW"; do [ -x "$b/bench/moex_ep_bench" ] || { failed=1; echo "ep: no $b/bench/moex_ep_bench"; }; done
    if [ "$NGPU" -ge 2 ]; then for t in peer capacity; do alternate "ep_$t" ep_bench "$t"; done; fi
    echo "ep: $((SECONDS - t0)) s"
fi

echo "all parts: $((SECONDS - t_all)) s; logs and JSON in $OUTDIR"
echo
python3 - "$OUTDIR" <<'EOF' | tee "$OUTDIR/compare.txt"
import glob, json, os, statistics, sys

out = sys.argv[1]
# `moex bench --ops gemm`'s grouped linear rows, each build through its own CLI (gemm_bench.py
# needs both libraries to have this tree's struct layouts)
CLI_GEMMS = {"forward": "cli_fwd", "backward_data": "cli_dgrad", "backward_weight": "cli_wgrad"}
ORDER = ["fwd", "dgrad", "wgrad", "fwd_bias", "fwd_sbias", "cli_fwd", "cli_dgrad", "cli_wgrad", "mlp_fwd", "mlp_fwd_bwd", "moe_fwd", "moe_bwd",
         "fp8_fwd_group", "fp8_fwd_block", "fp8_wgrad_group", "fp8_wgrad_block", "moe_layer_bf16", "moe_layer_fp8",
         "ep_dispatch_peer", "ep_combine_peer", "ep_dispatch_peer-fp8", "ep_dispatch_capacity", "ep_combine_capacity",
         "ep_dispatch_capacity-fp8"]
rates = {}   # (config, splits, op) -> {"old": [TFLOP/s...], "new": [...]}

def add(key, which, tf):
    rates.setdefault(key, {"old": [], "new": []})[which].append(tf)

path = os.path.join(out, "gemm_bench.jsonl")
if os.path.exists(path):
    for line in open(path).read().splitlines()[1:]:
        r = json.loads(line)
        key = (r["config"], r["splits"], r["op"])
        add(key, "old", r.get("moex_base_tflops"))
        add(key, "new", r.get("moex_tflops"))
for f in sorted(glob.glob(os.path.join(out, "cli", "*.json"))):
    which = os.path.basename(f).split(".")[-3]   # OPS.CONFIG.SPLITS.WHICH.REP.json
    try:
        d = json.load(open(f))
    except ValueError:
        continue   # a failed run: its message is in the .err beside it
    for r in d["results"]:
        op = CLI_GEMMS.get(r["op"], r["op"])
        if op in ("mlp_fwd", "mlp_fwd_bwd", "moe_fwd", "moe_bwd") or op in CLI_GEMMS.values():
            add((r["config"], r["splits"], op), which, r["gflops"] / 1e3 if r.get("gflops") else None)

# runs/NAME.WHICH.REP.out: fp8_bench.py's and moe_fp8_bench.py's JSON lines, ep_bench's EPBENCH lines
for f in sorted(glob.glob(os.path.join(out, "runs", "*.out"))):
    name, which = os.path.basename(f).split(".")[:2]
    for line in open(f).read().splitlines():
        if line.startswith("EPBENCH ") and name.startswith("ep_"):
            kv = dict(p.split("=", 1) for p in line.split()[1:])   # impl moex-peer, moex-peer-fp8, ...
            if kv["impl"].startswith("moex-") and kv["op"] in ("dispatch", "combine"):
                add((f"EP {kv['N']}", "random", f"ep_{kv['op']}_{kv['impl'][5:]}"), which, float(kv["GBps"]))
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if name in ("fp8_forward", "fp8_wgrad") and "moex_fp8" in r:
            p = "fwd" if name == "fp8_forward" else "wgrad"
            add((r["config"], r["splits"], f"fp8_{p}_group"), which, r["moex_fp8"])
            add((r["config"], r["splits"], f"fp8_{p}_block"), which, r["moex_block"])
        elif name == "fp8_layer" and "config" in r:
            add((r["config"], "layer", "moe_layer_bf16"), which, r.get("bf16"))
            add((r["config"], "layer", "moe_layer_fp8"), which, r.get("block"))

def med(v):
    v = [x for x in v if x]
    return statistics.median(v) if v else None

configs = list(dict.fromkeys(k[0] for k in rates))
keys = sorted(rates, key=lambda k: (configs.index(k[0]), k[1], ORDER.index(k[2]) if k[2] in ORDER else 99))
fmt = lambda v: f"{v:>10.4g}" if v else f"{'n/a':>10}"   # noqa: E731
print("old = OLD_BUILD, new = NEW_BUILD, in TFLOP/s (ep_*: GB/s): fwd ... fwd_sbias from bench/gemm_bench.py (both")
print("libraries in one rotation); mlp_*, moe_*, fp8_*, moe_layer_* and ep_* the medians over the alternating")
print("invocations; new/old = speed of new over old; SLOWER: below 0.99")
print(f"{'config':<14} {'splits':<8} {'op':<12} {'old':>10} {'new':>10} {'new/old':>8}")
slower = missing = 0
for k in keys:
    old, new = med(rates[k]["old"]), med(rates[k]["new"])
    ratio = new / old if old and new else None
    flag = "  SLOWER" if ratio is not None and ratio < 0.99 else ""
    slower += bool(flag)
    missing += ratio is None
    print(f"{k[0]:<14} {k[1]:<8} {k[2]:<12} {fmt(old)} {fmt(new)} " + (f"{ratio:>8.4f}" if ratio else f"{'n/a':>8}") + flag)
print(f"{len(keys)} rows, {slower} slower than 0.99" + (f", {missing} without a result" if missing else ""))
EOF
exit $failed
