#!/bin/bash
# `collage tune --device cuda` on a GPU machine that has torch but no IREE and no network.
#
# Here (CPU machine): python -m studies.gpu.tune_kit build/gpu_tune   (the IREE compiler and runtime for
#   CPython 3.12, stripped and packed; the models as StableHLO with their inputs and IREE CPU outputs)
# There, from the repository root, carrying build/gpu_tune:
#   bash studies/gpu/tune_on_gpu.sh build/gpu_tune $OUT [BUDGET_S] [MODEL ...]
# Environment: TUNE_ARGS (more `collage tune` arguments, e.g. "--backends iree-cuda,cudnn,cublas"),
# NO_TESTS=1 (skip the gpu-marked tests).
# Writes OUT/log.txt and OUT/tune.tgz (plans, cost DB, each step's log, summary.md).
set -u
KIT=${1:?kit folder}; OUTDIR=${2:?output folder}; BUDGET=${3:-60}; shift 3 2>/dev/null || shift $#
MODELS=${*:-$(cat "$KIT/models.txt")}
W=/tmp/collage_tune; SITE=$W/site; mkdir -p "$SITE" "$W/out" "$OUTDIR"
exec > >(tee "$OUTDIR/log.txt") 2>&1
step() { echo "== $(date +%T) $*"; }

step unpack
tar xf "$KIT/site.tar.xz" -C "$SITE" || exit 1
xz -d -T0 -c "$KIT/libIREECompiler.so.xz" > "$SITE/iree/compiler/_mlir_libs/libIREECompiler.so" || exit 1
chmod +x "$SITE"/iree/compiler/_mlir_libs/iree-* "$SITE"/iree/_runtime_libs/iree-* 2>/dev/null
export PYTHONPATH=$PWD:$PWD/runtime:$SITE PYTHONUNBUFFERED=1 COLLAGE_CACHE_DIR=$W/cache COLLAGE_DB=$W/out/costs.sqlite
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
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
  timeout $((BUDGET * 2 + 60)) python3 -m collage_mlir.tools.cli tune "$KIT/$m.mlir" --device cuda --budget "$BUDGET" \
    ${TUNE_ARGS:-} "${ins[@]}" -o "$W/out/$m.plan.json" > "$W/out/$m.tune.log" 2>&1; trc=$?
  wall=$(( $(date +%s) - t0 )); echo "tune rc=$trc wall=${wall}s"; tail -25 "$W/out/$m.tune.log"
  crc=-; rrc=-; err=-; plan=-
  if [ -f "$W/out/$m.plan.json" ]; then
    plan=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(p.get('default_backend'), dict((lambda c: c)(__import__('collections').Counter(r['backend'] for r in p.get('regions', [])))))" "$W/out/$m.plan.json" 2>/dev/null)
    step "compile + run $m"
    timeout 240 python3 -m collage_mlir.tools.cli compile "$KIT/$m.mlir" --plan "$W/out/$m.plan.json" --device cuda \
      -o "$W/art/$m" > "$W/out/$m.compile.log" 2>&1; crc=$?; tail -3 "$W/out/$m.compile.log"
    if [ $crc = 0 ]; then
      timeout 120 python3 -m collage_mlir.tools.cli run "$W/art/$m" "${ins[@]}" --output-dir "$W/out/$m.outs" \
        > "$W/out/$m.run.log" 2>&1; rrc=$?; tail -3 "$W/out/$m.run.log"
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
  echo "| $m | $trc | $wall | $plan | $crc | $rrc | $err |" >> "$W/out/summary.md"
  tar czf "$OUTDIR/tune.tgz" -C "$W/out" . 2>/dev/null
done
step done
cat "$W/out/summary.md"
tar czf "$OUTDIR/tune.tgz" -C "$W/out" .
