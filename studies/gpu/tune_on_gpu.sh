#!/bin/bash
# `collage tune --device cuda` on a GPU machine that has torch but no IREE and no network.
#
# Here (CPU machine): python -m studies.gpu.tune_kit build/gpu_tune   (the IREE compiler and runtime for
#   CPython 3.12, stripped and packed; the models as StableHLO with their inputs and IREE CPU outputs)
# There, from the repository root, carrying build/gpu_tune:
#   bash studies/gpu/tune_on_gpu.sh build/gpu_tune $OUT [BUDGET_S] [MODEL ...]
# Environment: TUNE_ARGS (more `collage tune` arguments, e.g. "--backends iree-cuda,cudnn,cublas"),
# NO_TESTS=1 (skip the gpu-marked tests), NO_PEERS=1 (do not time torch eager / torch.compile),
# ALSO_DEFAULT=1 (compile the default plan, IREE alone, and time it in the same rounds as the tuned one),
# ALSO_PLANS (more plans compiled and timed in those rounds, e.g. "prefer:triton-tf32x3 prefer:triton"),
# COMPILE_MODE (torch.compile's mode, default reduce-overhead).
# Each torch model's compiled plan is then timed against torch eager and torch.compile (tuned_vs_torch.py).
# Writes OUT/log.txt and OUT/tune.tgz (plans, cost DB, each step's log, summary.md, peers.md).
set -u
DEVICE=${DEVICE:-cuda}  # cpu: a dry run of this script on the CPU machine
KIT=${1:?kit folder}; OUTDIR=${2:?output folder}; BUDGET=${3:-60}; shift 3 2>/dev/null || shift $#
MODELS=${*:-$(cat "$KIT/models.txt")}
W=/tmp/collage_tune; SITE=$W/site; mkdir -p "$SITE" "$W/out" "$OUTDIR"
exec > >(tee "$OUTDIR/log.txt") 2>&1
step() { echo "== $(date +%T) $*"; }

step unpack
if [ "$DEVICE" != cpu ]; then  # the dry run uses this machine's own IREE
  tar xf "$KIT/site.tar.xz" -C "$SITE" || exit 1
  xz -d -T0 -c "$KIT/libIREECompiler.so.xz" > "$SITE/iree/compiler/_mlir_libs/libIREECompiler.so" || exit 1
  chmod +x "$SITE"/iree/compiler/_mlir_libs/iree-* "$SITE"/iree/_runtime_libs/iree-* 2>/dev/null
  # collage's backends as the kit's tree registers them (older kits carried them inside site.tar.xz)
  [ -d "$KIT/collage_mlir-0.1.0.dist-info" ] && { rm -rf "$SITE/collage_mlir-0.1.0.dist-info"; cp -r "$KIT/collage_mlir-0.1.0.dist-info" "$SITE/"; }
fi
mkdir -p "$W/models"; for f in "$KIT"/*.mlir.xz; do xz -d -c "$f" > "$W/models/$(basename "$f" .xz)" || exit 1; done
# Kernels compiled on the CPU machine (tune_kit --kernels): the tune finds them in its kernel cache.
[ -f "$KIT/kernels.tar.xz" ] && { mkdir -p "$W/cache"; tar xJf "$KIT/kernels.tar.xz" -C "$W/cache" || exit 1; }
export PYTHONPATH=$PWD:$PWD/runtime:$SITE PYTHONUNBUFFERED=1 COLLAGE_CACHE_DIR=$W/cache COLLAGE_DB=$W/out/costs.sqlite
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, iree.compiler, iree.runtime as rt; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'iree', rt.version.VERSION if hasattr(rt, 'version') else '?')"
collage() { python3 -m collage_mlir.tools.cli "$@"; }
collage backends 2>&1 | head -40

[ -n "${NO_TESTS:-}" ] || { step "pytest -m gpu"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu test/python/backends/test_gpu_libraries.py \
  test/python/backends/test_gpu_programs.py > "$W/out/pytest.log" 2>&1; echo "pytest rc=$?"; tail -15 "$W/out/pytest.log"; }

echo "| model | tune rc | wall s | plan | compile rc | run rc | max err vs IREE CPU |" > "$W/out/summary.md"
echo "|---|---:|---:|---|---:|---:|---:|" >> "$W/out/summary.md"
for m in $MODELS; do
  ins=(); for f in "$KIT/$m".in*.npy; do ins+=(--input "$f"); done
  step "tune $m (budget ${BUDGET}s)"
  t0=$(date +%s)
  timeout $((BUDGET * 2 + 60)) python3 -m collage_mlir.tools.cli tune "$W/models/$m.mlir" --device $DEVICE --budget "$BUDGET" \
    ${TUNE_ARGS:-} "${ins[@]}" -o "$W/out/$m.plan.json" > "$W/out/$m.tune.log" 2>&1; trc=$?
  wall=$(( $(date +%s) - t0 )); echo "tune rc=$trc wall=${wall}s"; tail -25 "$W/out/$m.tune.log"
  python3 - "$COLLAGE_DB" <<'EOF'
import json, sqlite3, sys
try:
    with sqlite3.connect(sys.argv[1]) as c:
        rows = [json.loads(d) for (d,) in c.execute("SELECT document FROM derived WHERE kind = 'tune-result'")]
except sqlite3.OperationalError:  # the tune stopped before its DB had tables
    rows = []
for r in rows[-1:]:
    print("stored plans' defaults (DP, singles):", sorted({p["default_backend"] for p in (r["dp_plan"], *r["single"].values())}))
EOF
  crc=-; rrc=-; err=-; plan=-
  if [ -f "$W/out/$m.plan.json" ]; then
    plan=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(p.get('default_backend'), dict((lambda c: c)(__import__('collections').Counter(r['backend'] for r in p.get('regions', [])))))" "$W/out/$m.plan.json" 2>/dev/null)
    step "compile + run $m"
    timeout 240 python3 -m collage_mlir.tools.cli compile "$W/models/$m.mlir" --plan "$W/out/$m.plan.json" --device $DEVICE \
      -o "$W/art/$m" > "$W/out/$m.compile.log" 2>&1; crc=$?; tail -3 "$W/out/$m.compile.log"
    if [ $crc = 0 ]; then
      timeout 120 python3 -m collage_mlir.tools.cli run "$W/art/$m" "${ins[@]}" --output-dir "$W/out/$m.outs" \
        > "$W/out/$m.run.log" 2>&1; rrc=$?; tail -3 "$W/out/$m.run.log"
      # A plan with kernel regions: each kernel alone (CUDA graphs), summed: the rest of the plan's time is IREE's.
      [ -d "$W/art/$m/kernels" ] && [ "$DEVICE" != cpu ] && timeout 120 python3 -m studies.gpu.kernel_overhead \
        --kernels-of "$W/art/$m" "$W/out" --name "$m.kernels" 2>&1 | tail -1
      err=$(python3 - "$KIT/ref_$m" "$W/out/$m.outs" <<'EOF'
import sys, numpy as np
from pathlib import Path
ref, got = Path(sys.argv[1]), Path(sys.argv[2])
worst = 0.0
for r in sorted(ref.glob("out_*.npy")):
    a, b = np.load(r), np.load(got / r.name)
    scale = max(float(np.abs(a).max()), 1e-30) if a.dtype.kind == "f" else 1.0
    worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) / scale)
print(f"{worst:.2e}")
EOF
)
    fi
  fi
  spec=$(awk -v m="$m" '$1 == m {print $2}' "$KIT/torch_models.txt" 2>/dev/null)
  if [ -z "${NO_PEERS:-}" ] && [ -n "$spec" ] && [ "$crc" = 0 ]; then
    step "time $m against torch ($spec)"
    [ -f "$W/out/peers.md" ] || printf '%s\n%s\n' "| model | collage tuned ms | torch eager | torch.compile | best peer / tuned | vs torch eager | vs IREE CPU |" \
      "|---|---:|---:|---:|---|---:|---:|" > "$W/out/peers.md"
    # Other plans timed in the same rounds, compiled side by side: IREE alone (ALSO_DEFAULT) and ALSO_PLANS
    # (e.g. "prefer:triton-tf32x3 prefer:triton": each kernel backend whole, whatever the tune reached).
    extra=(${ALSO_DEFAULT:+default} ${ALSO_PLANS:-}); pids=(); also=()
    for p in "${extra[@]}"; do n=${p#prefer:}; n=${n//[^A-Za-z0-9_.-]/_}
      timeout 240 python3 -m collage_mlir.tools.cli compile "$W/models/$m.mlir" --plan "$p" --device $DEVICE \
        -o "$W/art/${m}_$n" > "$W/out/$m.compile_$n.log" 2>&1 & pids+=($!); done
    for i in "${!extra[@]}"; do p=${extra[$i]}; n=${p#prefer:}; n=${n//[^A-Za-z0-9_.-]/_}
      # wait on each pid: a bare `wait` would also wait for the log's tee (bash 5.1), i.e. forever
      if wait "${pids[$i]}"; then also+=(--also "$W/art/${m}_$n=collage $p"); else echo "compile $p failed"; tail -2 "$W/out/$m.compile_$n.log"; fi
    done
    timeout 200 python3 -m studies.gpu.tuned_vs_torch "$W/art/$m" "$spec" --inputs "$KIT/$m".in*.npy "${also[@]}" \
      --ref "$KIT/ref_$m" --device $DEVICE --compile-mode "${COMPILE_MODE:-reduce-overhead}" --out "$W/out/peers.jsonl" \
      > "$W/out/$m.peers.log" 2>&1; echo "peers rc=$?"; grep -v Warning "$W/out/$m.peers.log" | tail -8
    grep '^| ' "$W/out/$m.peers.log" | tail -1 >> "$W/out/peers.md"
  fi
  echo "| $m | $trc | $wall | $plan | $crc | $rrc | $err |" >> "$W/out/summary.md"
  tar czf "$OUTDIR/tune.tgz" -C "$W/out" . 2>/dev/null
done
step done
cat "$W/out/summary.md"; [ -f "$W/out/peers.md" ] && cat "$W/out/peers.md"
tar czf "$OUTDIR/tune.tgz" -C "$W/out" .
