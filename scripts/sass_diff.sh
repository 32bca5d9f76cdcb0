#!/usr/bin/env bash
# sass_diff.sh - compares the SASS of every Hopper (sm_90a) kernel instantiation of a git
# revision with the working tree's, kernel by kernel, without a GPU: both trees' src/cuda/sm90_*.cu
# are compiled with the flags the CMake build gives them (CMakeLists.txt: -O3 -DNDEBUG,
# sm_90a, --expt-relaxed-constexpr -lineinfo), `cuobjdump -sass` is split per kernel, and the
# kernel names are normalised to one canonical key per instantiation (dtype, product, tile
# rows, cluster, stream-K, TMA epilogue), so that renamed or re-templated kernels are still
# paired. Prints one line per kernel: `same` (byte-identical SASS, encodings and control
# codes included), `DIFF` (with the instruction counts of both sides) or `only old/new`, then
# a count. A DIFF line also says whether the kernel's k loops (the innermost loops that issue
# wgmma, compared with register numbers, reuse hints, addresses and branch targets dropped)
# still match, instruction for instruction in order:
# where they do, the change is outside the hot loop. Exit status 0 whatever it found.
# Usage: scripts/sass_diff.sh OLD_REV [KEEP_DIR]
#   KEEP_DIR (default a temporary folder): where the objects and the per-kernel SASS stay, as
#   old/<key>.sass and new/<key>.sass, for `diff` by hand; a second run with the same KEEP_DIR
#   and OLD_REV compiles only the working tree.
# Needs nvcc (CUDA 12.x or 13.x), and cuobjdump and nvdisasm on the PATH or in
# /usr/local/cuda/bin; without a toolkit that has them: pip install nvidia-cuda-cuobjdump
# nvidia-cuda-nvdisasm (their bin folder, .../site-packages/nvidia/cu13/bin, is searched too).
set -u
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,19p' "$0"; exit 2; }
OLD_REV=$1
WORK=${2:-$(mktemp -d)}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
PIPBIN=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin"))' 2>/dev/null)
export PATH=$PATH:/usr/local/cuda/bin${PIPBIN:+:$PIPBIN}
command -v cuobjdump > /dev/null && command -v nvdisasm > /dev/null ||
    { echo "sass_diff: cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"; exit 1; }
FLAGS=(-O3 -DNDEBUG "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]" -Xcompiler=-fPIC
       --expt-relaxed-constexpr -lineinfo -DMOEX_HAVE_CUDA=1 -D_POSIX_C_SOURCE=200809L)

mkdir -p "$WORK/old" "$WORK/new" "$WORK/obj_old" "$WORK/obj_new"
rm -rf "$WORK/old_src" && mkdir -p "$WORK/old_src" && git archive "$OLD_REV" include src | tar -x -C "$WORK/old_src" || exit 1

# tree objdir sassdir: every sm90_*.cu of the tree, compiled and dumped per kernel
dump() {
    local tree=$1 obj=$2 out=$3 f
    for f in "$tree"/src/cuda/sm90_*.cu; do
        "$NVCC" "${FLAGS[@]}" -I"$tree/include" -I"$tree/src/core" -I"$tree/src/cpu" -I"$tree/src/cuda" \
            -x cu -c "$f" -o "$obj/$(basename "$f" .cu).o" || return 1
        cuobjdump -sass "$obj/$(basename "$f" .cu).o" > "$obj/$(basename "$f" .cu).sass" || return 1
    done
    cat "$obj"/*.sass | python3 -c '
import re, subprocess, sys
out = sys.argv[1]
text = sys.stdin.read()
parts = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
names = parts[1::2]
dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
DT = {0: "bf16", 1: "f16"}
# OP of the rows kernel: a forward epilogue kind (MOEX_SM90_EPI_*), or SM90_OP_DGRAD (8) plus the
# kind of the dgrad (12, 13: DGLU); 4: the dgrad of the older sm90_grouped_kernel
OPS = {0: "fwd", 1: "fwd_bias", 2: "fwd_glu_contig", 3: "fwd_glu_inter", 4: "dgrad", 8: "dgrad",
       12: "dgrad_dglu_contig", 13: "dgrad_dglu_inter"}
def key(d):
    m = re.match(r"void (\w+)<([^>]*)>", d)
    if not m:
        return re.sub(r"\W+", "_", d)
    k, a = m.group(1), [int(x.strip()) for x in m.group(2).split(",")]
    if k == "sm90_grouped_kernel" and len(a) == 7:    # <F16, EPI_TMA, CM, TB, BM, EPI, SK>
        f16, tma, cm, tb, bm, epi, sk = a
        op = 4 if tb else epi
    elif k == "sm90_rows_kernel" and len(a) == 6:     # <F16, BM, CM, OP, SK, EPI_TMA>
        f16, bm, cm, op, sk, tma = a
    elif k == "sm90_wgrad_kernel" and len(a) == 3:    # <F16, EPI_TMA, CM>: the TMA one is paired
        f16, tma, cm = a
        return f"wgrad_{DT[f16]}_cm{cm}" + ("" if tma else "_regepi")
    elif k == "sm90_wgrad_kernel" and len(a) == 2:    # <F16, CM>
        f16, cm = a
        return f"wgrad_{DT[f16]}_cm{cm}"
    else:
        return k + "_" + "_".join(map(str, a))
    return f"rows_{DT[f16]}_{OPS[op]}_bm{bm}_cm{cm}_sk{sk}" + ("" if tma else "_regepi")
for n, d, body in zip(names, dem, parts[2::2]):
    # the instructions (text, encoding and control codes) and labels only: what follows the
    # last kernel of a file is the header of the next fatbin section
    keep = [l for l in body.split("\n") if "/*" in l or l.strip().startswith((".L", ".headerflags"))]
    with open(f"{out}/{key(d)}.sass", "w") as f:
        f.write("\n".join(keep) + "\n")
' "$out"
}
# the old side is reused when KEEP_DIR already holds it for the same commit
rev=$(git rev-parse "$OLD_REV^{commit}")
if [ "$(cat "$WORK/old.rev" 2>/dev/null)" != "$rev" ]; then
    rm -f "$WORK/old.rev" "$WORK"/old/*.sass
    dump "$WORK/old_src" "$WORK/obj_old" "$WORK/old" || { echo "sass_diff: building $OLD_REV failed"; exit 1; }
    echo "$rev" > "$WORK/old.rev"
fi
rm -f "$WORK"/new/*.sass "$WORK"/obj_new/*
dump "$PWD" "$WORK/obj_new" "$WORK/new" || { echo "sass_diff: building the working tree failed"; exit 1; }

# per kernel: byte-identical, or else whether its k loops (the innermost loops that issue
# HGMMA, registers and addresses aside) still match, and the instruction counts
python3 - "$WORK" "$OLD_REV" <<'PY'
import os, re, sys
work, rev = sys.argv[1], sys.argv[2]
def insns(path):
    out = []
    for l in open(path):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?);", l)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out
def norm(t):
    t = re.sub(r"\bU?R\d+\b", "R", t.replace(".reuse", ""))
    t = re.sub(r"\bU?P\d\b", "P", t)
    t = re.sub(r"\bB\d+\b", "B", t)
    return re.sub(r"\s+", " ", re.sub(r"0x[0-9a-f]+", "X", t))
def kloops(ins):
    loops = []
    for a, t in ins:
        m = re.search(r"BRA 0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a:
            body = [norm(x) for b, x in ins if int(m.group(1), 16) <= b <= a]
            if any("HGMMA" in x for x in body):
                loops.append(body)
    return sorted(x for x in loops if not any(len(y) < len(x) and y[0] in x and y[-1] in x for y in loops))
keys = sorted(set(os.listdir(f"{work}/old")) | set(os.listdir(f"{work}/new")))
count = {"same": 0, "DIFF": 0, "only": 0}
for k in (k for k in keys if k.endswith(".sass")):
    o, n = f"{work}/old/{k}", f"{work}/new/{k}"
    if not os.path.exists(o) or not os.path.exists(n):
        print(f"only {'new' if os.path.exists(n) else 'old'}  {k[:-5]}")
        count["only"] += 1
    elif open(o).read() == open(n).read():
        print(f"same      {k[:-5]}")
        count["same"] += 1
    else:
        io, inn = insns(o), insns(n)
        lo, ln = kloops(io), kloops(inn)
        print(f"DIFF      {k[:-5]}: {len(io)} -> {len(inn)} instructions; k loops "
              + ("match" if lo == ln else "DIFFER") + f" ({[len(x) for x in lo]} -> {[len(x) for x in ln]})")
        count["DIFF"] += 1
print(f"sass_diff {rev} vs working tree: {count['same']} same, {count['DIFF']} differ, {count['only']} unpaired "
      f"(SASS in {work})")
PY
