// RUN: collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-plan.json" | filecheck %s
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/unknown-op.json" 2>&1 | filecheck %s --check-prefix=UNKNOWN-OP
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/unknown-backend.json" 2>&1 | filecheck %s --check-prefix=UNKNOWN-BACKEND
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/not-convex.json" 2>&1 | filecheck %s --check-prefix=NOT-CONVEX
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/overlap.json" 2>&1 | filecheck %s --check-prefix=OVERLAP
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/cannot-take.json" 2>&1 | filecheck %s --check-prefix=CANNOT-TAKE
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/bad-version.json" 2>&1 | filecheck %s --check-prefix=VERSION
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-assign="plan=%S/Inputs/mlp-plan.json" 2>&1 | filecheck %s --check-prefix=UNNUMBERED

// The plan's ops get the region's backend and name; others stay untagged (default backend).
// CHECK-LABEL: func.func @main
// CHECK: stablehlo.constant {collage.id = 0 : i64}
// CHECK: stablehlo.dot_general {{.*}}{collage.backend = "onednn", collage.id = 1 : i64, collage.region = "layer1"}
// CHECK: stablehlo.broadcast_in_dim {{.*}}{collage.backend = "onednn", collage.id = 2 : i64, collage.region = "layer1"}
// CHECK: stablehlo.add {{.*}}{collage.backend = "onednn", collage.id = 3 : i64, collage.region = "layer1"}
// CHECK: stablehlo.maximum {{.*}}{collage.backend = "onednn", collage.id = 4 : i64, collage.region = "layer1"}
// CHECK: stablehlo.dot_general {{.*}}{collage.id = 5 : i64}
// CHECK: stablehlo.tanh {{.*}}{collage.backend = "iree-cpu", collage.id = 6 : i64, collage.region = "act"}

// Each bad plan fails with one line naming the plan, the region and what to do.
// UNKNOWN-OP: collage-opt: error: {{.*}}unknown-op.json: region 'r': unknown op id 42 (the module has ids 0..6)
// UNKNOWN-BACKEND: collage-opt: error: {{.*}}unknown-backend.json: region 'r': unknown backend 'tpu-magic'; known backends: {{.*}}iree-cpu, {{.*}}onednn
// NOT-CONVEX: collage-opt: error: {{.*}}not-convex.json: region 'r': ops are not a convex set
// OVERLAP: collage-opt: error: {{.*}}overlap.json: region 'b': op 2 is also in region 'a'
// CANNOT-TAKE: collage-opt: error: {{.*}}cannot-take.json: region 'r': backend 'onednn' cannot take it at {{.*}}mlp.mlir:9:8: no onednn pattern covers exactly these ops (stablehlo.tanh)
// VERSION: collage-opt: error: {{.*}}bad-version.json: unsupported plan version 7
// UNNUMBERED: collage-opt: error: no op has a collage.id; run --collage-number-ops before --collage-assign
