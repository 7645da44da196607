// RUN: collage-opt %s --split-input-file --verify-diagnostics --collage-outline --collage-lower --collage-place-devices

// Errors of the passes after collage-assign, from bad collage.* attributes: MLIR diagnostics on the op
// they are about (or the module), checked with --verify-diagnostics.

func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{region name 'helper' clashes with an existing symbol}}
  %0 = stablehlo.negate %a {collage.backend = "iree-cpu", collage.region = "helper"} : tensor<4xf32>
  %1 = call @helper(%0) : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}

// -----

func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{unknown backend 'tpu-magic'}}
  %0 = stablehlo.negate %a {collage.backend = "tpu-magic", collage.region = "r"} : tensor<4xf32>
  %1 = stablehlo.tanh %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// expected-error @+1 {{the module already declares IREE devices (hal.device.targets)}}
module attributes {hal.device.targets = {d = #hal.device.target<"local", {ordinal = 0 : index}, [#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {}>]> : !hal.device}} {
  func.func @main(%a: tensor<4x8xf32>, %w: tensor<8x16xf32>) -> tensor<4x16xf32> {
    %0 = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] {collage.backend = "iree-cpu-dt", collage.region = "mm"} : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    return %0 : tensor<4x16xf32>
  }
}

// -----

func.func @main(%a: tensor<?x8xf32>, %w: tensor<8x16xf32>) -> tensor<?x16xf32> {
  // expected-error @+1 {{cannot move a dynamically shaped tensor (tensor<?x8xf32>) to device @dev_iree_cpu_dt}}
  %0 = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] {collage.backend = "iree-cpu-dt", collage.region = "mm"} : (tensor<?x8xf32>, tensor<8x16xf32>) -> tensor<?x16xf32>
  return %0 : tensor<?x16xf32>
}
