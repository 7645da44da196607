// RUN: not collage-opt %s --split-input-file --collage-place-devices 2>/dev/null | filecheck %s
// RUN: not collage-opt %s --split-input-file --collage-place-devices 2>&1 >/dev/null | filecheck %s --check-prefix=ERR
// (The last case is an error, so collage-opt exits 1 on this file: hence `not`.)


// A region of iree-cpu-dt runs on a device of its own: the module declares both devices (the default
// one first, plain layouts; the data-tiling one with ukernels and the CPU encoding resolver) and that
// they share memory; the call's operands move to its device, its results come back.
// CHECK-DAG: #[[T0:[a-z_0-9]+]] = #hal.executable.target<"llvm-cpu", {{.*}}iree.encoding.resolver = #iree_encoding.identity_resolver{{[^"]*}}target_triple = "{{[^"]*}}"}>
// CHECK-DAG: #[[T1:[a-z_0-9]+]] = #hal.executable.target<"llvm-cpu", {{.*}}iree.encoding.resolver = #iree_cpu.cpu_encoding_resolver<>{{.*}}ukernels = "all"}>
// CHECK: #[[DEFAULT:[a-z_0-9]+]] = #hal.device.target<"local", {ordinal = 0 : index}, [#[[T0]]]> : !hal.device
// CHECK: #[[DT:[a-z_0-9]+]] = #hal.device.target<"local", {ordinal = 1 : index}, [#[[T1]]]> : !hal.device
// CHECK-LABEL: module attributes
// CHECK-SAME: hal.device.default = "dev_default"
// CHECK-SAME: hal.device.targets = {dev_default = #[[DEFAULT]], dev_iree_cpu_dt = #[[DT]]}
// CHECK-SAME: stream.topology = #hal.device.topology<links = [(@dev_default -> @dev_iree_cpu_dt = {unified_memory = true}), (@dev_iree_cpu_dt -> @dev_default = {unified_memory = true})]>
// CHECK-LABEL: func.func @main
// CHECK-NEXT: %[[X:.*]] = stablehlo.negate %arg0
// CHECK-NEXT: %[[XT:.*]] = flow.tensor.transfer %[[X]] : tensor<4x8xf32> to #hal.device.affinity<@dev_iree_cpu_dt>
// CHECK-NEXT: %[[WT:.*]] = flow.tensor.transfer %arg1 : tensor<8x16xf32> to #hal.device.affinity<@dev_iree_cpu_dt>
// CHECK-NEXT: %[[R:.*]] = call @mm(%[[XT]], %[[WT]]) {collage.device = "dev_iree_cpu_dt"}
// CHECK-NEXT: %[[RB:.*]] = flow.tensor.transfer %[[R]] : tensor<4x16xf32> to #hal.device.affinity<@dev_default>
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[RB]]
// CHECK-NEXT: return %[[T]]
// CHECK-LABEL: func.func private @mm
// CHECK-NEXT: stablehlo.dot_general %arg0, %arg1
module {
  func.func @main(%a: tensor<4x8xf32>, %w: tensor<8x16xf32>) -> tensor<4x16xf32> {
    %x = stablehlo.negate %a : tensor<4x8xf32>
    %r = call @mm(%x, %w) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    %t = stablehlo.tanh %r : tensor<4x16xf32>
    return %t : tensor<4x16xf32>
  }
  func.func private @mm(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) -> tensor<4x16xf32> attributes {collage.backend = "iree-cpu-dt", collage.region = "mm"} {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    return %0 : tensor<4x16xf32>
  }
}

// -----

// A constant shared by both devices is pinned to the default device where the default device uses it
// (in a contraction left in the function, and as a default codegen region's operand); values computed
// from arguments are not pinned, since a pin blocks fusion.
// CHECK-LABEL: func.func @shared
// CHECK-NEXT: %[[W:.*]] = stablehlo.constant dense<1.000000e+00> : tensor<8x8xf32>
// CHECK-NEXT: %[[WDT:.*]] = stablehlo.transpose %[[W]]
// CHECK-NEXT: %[[AT:.*]] = flow.tensor.transfer %arg0 : tensor<4x8xf32> to #hal.device.affinity<@dev_iree_cpu_dt>
// CHECK-NEXT: %[[WTT:.*]] = flow.tensor.transfer %[[WDT]] : tensor<8x8xf32> to #hal.device.affinity<@dev_iree_cpu_dt>
// CHECK-NEXT: %[[R:.*]] = call @dt(%[[AT]], %[[WTT]]) {collage.device = "dev_iree_cpu_dt"}
// CHECK-NEXT: %[[RB:.*]] = flow.tensor.transfer %[[R]] : tensor<4x8xf32> to #hal.device.affinity<@dev_default>
// CHECK-NEXT: %[[W0:.*]] = flow.tensor.transfer %[[W]] : tensor<8x8xf32> to #hal.device.affinity<@dev_default>
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %[[RB]], %[[W0]]
// CHECK-NEXT: %[[W1:.*]] = flow.tensor.transfer %[[WDT]] : tensor<8x8xf32> to #hal.device.affinity<@dev_default>
// CHECK-NEXT: %[[E:.*]] = call @cpu(%[[D]], %[[W1]]) {collage.device = "dev_default"}
// CHECK-NEXT: return %[[E]]
module {
  func.func @shared(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w = stablehlo.constant dense<1.0> : tensor<8x8xf32>
    %wt = stablehlo.transpose %w, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %r = call @dt(%a, %wt) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %d = stablehlo.dot_general %r, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %e = call @cpu(%d, %wt) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %e : tensor<4x8xf32>
  }
  func.func private @dt(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> attributes {collage.backend = "iree-cpu-dt", collage.region = "dt"} {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
  func.func private @cpu(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> attributes {collage.backend = "iree-cpu", collage.region = "cpu"} {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}

// -----

// A function argument both devices read is pinned to each of them: otherwise IREE may hand the
// default device the data-tiling device's packed layout of it (wrong numbers, measured).
module {
  func.func @shared_arg(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
    %r = call @dt2(%x, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %e = call @cpu2(%r, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %e : tensor<4x8xf32>
  }
  func.func private @dt2(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> attributes {collage.backend = "iree-cpu-dt", collage.region = "dt2"} {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
  func.func private @cpu2(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> attributes {collage.backend = "iree-cpu", collage.region = "cpu2"} {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}
// CHECK-LABEL: func.func @shared_arg
// CHECK: flow.tensor.transfer %arg1 : tensor<8x8xf32> to #hal.device.affinity<@dev_iree_cpu_dt>
// CHECK: %[[R:.*]] = flow.tensor.transfer %{{.*}} : tensor<4x8xf32> to #hal.device.affinity<@dev_default>
// CHECK-NEXT: %[[W0:.*]] = flow.tensor.transfer %arg1 : tensor<8x8xf32> to #hal.device.affinity<@dev_default>
// CHECK-NEXT: call @cpu2(%[[R]], %[[W0]]) {collage.device = "dev_default"}

// -----

// Constants a contraction reads inside a region on the data-tiling device move to that device: left
// without a device, IREE encodes them on the default one (plain layout) and the data-tiled kernel reads
// them as packed (NaN, measured). Constants only an epilogue reads (the zero) stay foldable.
// CHECK-LABEL: func.func private @dt3
// CHECK-NEXT: %[[W:.*]] = stablehlo.constant dense<5.000000e-01> : tensor<1x8xf32>
// CHECK-NEXT: %[[WB:.*]] = stablehlo.broadcast_in_dim %[[W]]
// CHECK-NEXT: %[[Z:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
// CHECK-NEXT: %[[WT:.*]] = flow.tensor.transfer %[[WB]] : tensor<8x8xf32> to #hal.device.affinity<@dev_iree_cpu_dt>
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %arg0, %[[WT]]
// CHECK-NEXT: stablehlo.add %[[D]], %[[Z]]
module {
  func.func @sunk(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %r = call @dt3(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    return %r : tensor<4x8xf32>
  }
  func.func private @dt3(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {collage.backend = "iree-cpu-dt", collage.region = "dt3"} {
    %w = stablehlo.constant dense<0.5> : tensor<1x8xf32>
    %wb = stablehlo.broadcast_in_dim %w, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<8x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<4x8xf32>
    %0 = stablehlo.dot_general %x, %wb, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %1 = stablehlo.add %0, %z : tensor<4x8xf32>
    return %1 : tensor<4x8xf32>
  }
}

// -----

// Without regions needing a device of their own, the module only records its one device (for the
// manifest) and that it needs no extra IREE flags.
// CHECK-LABEL: module attributes {collage.devices = [{backends = ["iree-cpu"], name = "dev_default", ordinal = 0 : i64}], collage.iree_flags = []} {
// CHECK-NOT: hal.device
// CHECK-LABEL: func.func @single
// CHECK-NEXT: call @cpu_only(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK-NOT: flow.tensor.transfer
module {
  func.func @single(%a: tensor<4xf32>) -> tensor<4xf32> {
    %r = call @cpu_only(%a) : (tensor<4xf32>) -> tensor<4xf32>
    return %r : tensor<4xf32>
  }
  func.func private @cpu_only(%x: tensor<4xf32>) -> tensor<4xf32> attributes {collage.backend = "iree-cpu", collage.region = "cpu_only"} {
    %0 = stablehlo.tanh %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// A module that declares IREE devices itself cannot get more: one clear error.
// ERR: collage-opt: error: {{.*}}collage-place-devices.mlir:{{[0-9]+}}:1: the module already declares IREE devices (hal.device.targets); regions of dev_iree_cpu_dt need devices of their own
module attributes {hal.device.targets = {d = #hal.device.target<"local", {ordinal = 0 : index}, [#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {}>]> : !hal.device}} {
  func.func @declared(%a: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %r = call @mm2(%a, %a) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    return %r : tensor<4x4xf32>
  }
  func.func private @mm2(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {collage.backend = "iree-cpu-dt", collage.region = "mm2"} {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    return %0 : tensor<4x4xf32>
  }
}
