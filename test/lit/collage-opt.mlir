// RUN: collage-opt %s --pass-pipeline="builtin.module(collage-number-ops,canonicalize)" | filecheck %s
// RUN: collage-opt %s --collage-number-ops --canonicalize -o %t && filecheck %s < %t
// RUN: cat %s | collage-opt - --collage-number-ops | filecheck %s --check-prefix=STDIN
// RUN: not collage-opt %s --no-such-pass 2>&1 | filecheck %s --check-prefix=BADPASS
// RUN: not collage-opt %s --collage-assign="colour=red" 2>&1 | filecheck %s --check-prefix=BADOPT
// RUN: not collage-opt %S/Inputs/missing.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: not collage-opt %S/Inputs/syntax-error.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not collage-opt %s %s 2>&1 | filecheck %s --check-prefix=TWO
// RUN: not collage-opt %s -o 2>&1 | filecheck %s --check-prefix=NOOUT
// RUN: collage-opt --version | filecheck %s --check-prefix=VERSION
// RUN: collage-opt %s --collage-number-ops --mlir-print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=AFTER
// RUN: collage-opt %s --mlir-elide-elementsattrs-if-larger=2 | filecheck %s --check-prefix=ELIDE
// RUN: collage-opt %s --mlir-print-debuginfo | filecheck %s --check-prefix=DEBUG
// RUN: collage-opt --help | filecheck %s --check-prefix=HELP
// RUN: collage-opt %S/Inputs/mlp.mlir --collage-partition="plan=%S/Inputs/mlp-plan.json" | filecheck %s --check-prefix=PART

// Collage passes and upstream passes mix in one pipeline: ids survive canonicalization, which erases
// the dead add (id 2).
// CHECK-LABEL: func.func @fold
// CHECK-NEXT: stablehlo.constant {collage.id = 0 : i64}
// CHECK-NEXT: stablehlo.negate %arg0 {collage.id = 1 : i64}
// CHECK-NEXT: stablehlo.add %0, %cst {collage.id = 3 : i64}
// CHECK-NEXT: return
// STDIN: stablehlo.add %arg0, %cst {collage.id = 2 : i64}
func.func @fold(%a: tensor<4xf32>) -> tensor<4xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<4xf32>
  %0 = stablehlo.negate %a : tensor<4xf32>
  %1 = stablehlo.add %a, %z : tensor<4xf32>
  %2 = stablehlo.add %0, %z : tensor<4xf32>
  return %2 : tensor<4xf32>
}

// BADPASS: collage-opt: error: collage-opt: unknown pass or bad pipeline element 'no-such-pass'
// BADOPT: collage-opt: error: collage-opt: unknown option 'colour=red' for --collage-assign (options: plan)
// MISSING: collage-opt: error: {{.*}}missing.mlir: no such file
// SYNTAX: collage-opt: error: cannot parse MLIR: {{.*}}syntax-error.mlir:3:26: use of undeclared SSA value name

// TWO: collage-opt: error: one input file at a time
// NOOUT: collage-opt: error: -o needs a file name
// VERSION: collage-opt {{[0-9.]+}} (IREE compiler {{.*}})
// AFTER: IR Dump After NumberOpsPass: collage-number-ops
// ELIDE: dense_resource<__elided__> : tensor<3xf32>
// DEBUG: loc("{{.*}}collage-opt.mlir":{{[0-9]+}}:{{[0-9]+}})
// HELP: --collage-assign
// HELP-NEXT: plan=<path or none> (default: none)
func.func @elided() -> tensor<3xf32> {
  %c = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  return %c : tensor<3xf32>
}

// `collage compile`'s pipeline, as one element: number, assign, outline, lower, place devices.
// PART: module attributes {collage.devices = [{backends = ["iree-cpu"], name = "dev_default", ordinal = 0 : i64}], collage.iree_flags = []}
// PART: call @collage_rt.layer1
// PART: func.func private @collage_rt.layer1({{.*}}) -> tensor<2x16xf32> attributes {collage.backend = "onednn", collage.region = "layer1"}
