#!/usr/bin/env bash
# gpu_host.sh - host time per call on the GPU machine, in one call: bench/launch_floor.cu (the
# CUDA runtime's own floor) and bench/host_time.c against this tree's library and, when BASE
# names a folder of files from a baseline revision (its paths relative to the repository
# root, e.g. made by `git archive REV src | tar -x -C .base`), against the library built with
# those files in place (built first: $BUILD/libmoex.so is this tree's at the end). The two
# libraries' runs alternate (base, new, new, base, ...), ROUNDS
# of each; every row's minimum over the rounds is printed last.
# Usage: BASE=.base scripts/gpu_host.sh   Logs go to $OUT or $BUILD/host_out.
# Env: BUILD (default build-host), BASE (default none), ROUNDS (default 3).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-host}
OUT=${OUT:-$PWD/$BUILD/host_out}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
build() {
    { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
      ninja -C "$BUILD" moex moex_host_time moex_launch_floor; } >> "$OUT/build.log" 2>&1 ||
        { tail -30 "$OUT/build.log"; exit 1; }
    rm -rf "$BUILD/lib_$1" && mkdir -p "$BUILD/lib_$1" && cp -L "$BUILD"/libmoex.so.* "$BUILD/lib_$1/"
}
VARIANTS=new
if [ -n "${BASE:-}" ]; then   # the baseline first, so that the build ends with this tree's objects
    saved=$(mktemp -d)
    (cd "$BASE" && find . -type f) | while read -r f; do
        mkdir -p "$saved/$(dirname "$f")"
        if [ -f "$f" ]; then cp "$f" "$saved/$f"; else echo "$f" >> "$saved/.added"; fi
        cp "$BASE/$f" "$f"
    done
    build base
    [ ! -f "$saved/.added" ] || xargs rm -f < "$saved/.added"
    rm -f "$saved/.added" && cp -r "$saved"/. . && rm -rf "$saved"
    VARIANTS="base new"
fi
# the baseline's objects (of this call, or left by an earlier one on a warm machine) are newer
# than this tree's copies of those files
[ -n "${BASE:-}" ] && (cd "$BASE" && find . -type f) | while read -r f; do [ ! -f "$f" ] || touch "$f"; done
build new
"$BUILD/bench/moex_launch_floor" | tee "$OUT/launch_floor.log"
for r in $(seq "$ROUNDS"); do
    order=$VARIANTS; [ $((r % 2)) -eq 0 ] && order=$(echo "$VARIANTS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for v in $order; do
        LD_LIBRARY_PATH="$BUILD/lib_$v" "$BUILD/bench/moex_host_time" --json > "$OUT/host_${v}_$r.json" ||
            { echo "host_time ($v) failed"; exit 1; }
    done
done
python3 - "$OUT" $VARIANTS <<'PY'
import glob, json, sys
out, variants = sys.argv[1], sys.argv[2:]
best = {}
for v in variants:
    for f in glob.glob(f"{out}/host_{v}_*.json"):
        for line in open(f):
            r = json.loads(line)
            k = (r["op"], v)
            best[k] = min(best.get(k, 1e9), r["min_us"])
ops = sorted({k[0] for k in best}, key=lambda o: ("size" in o, o))
print("host time per call, us (minimum over the rounds)")
print(f"  {'op':40s}" + "".join(f"{v:>10s}" for v in variants))
for o in ops:
    print(f"  {o:40s}" + "".join(f"{best[(o, v)]:10.2f}" for v in variants))
PY
