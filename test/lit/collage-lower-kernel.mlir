// RUN: collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-kernel-plan.json" --collage-outline --collage-lower="kernel-arch=sm_90" | filecheck %s
// RUN: rm -rf %t && collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-kernel-plan.json" --collage-outline --collage-lower="artifact-dir=%t kernel-arch=sm_90" | filecheck %s --check-prefix=BUILT
// RUN: %PYTHON -c "import json, sys; print(json.load(open(sys.argv[1])))" %t/kernels/layer1.triton.cubin.json | filecheck %s --check-prefix=META
// RUN: not collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-kernel-plan.json" --collage-outline --collage-lower 2>&1 | filecheck %s --check-prefix=NOARCH

// A kernel region stays in the program: its body becomes the dispatch of its kernel, which reads the
// matmul's operands and the bias vector (the broadcast, add and max are the kernel's epilogue) and writes
// a fresh tensor tied to its result.
// CHECK: #executable_target_cuda_nvptx_fb = #hal.executable.target<"cuda", "cuda-nvptx-fb", {target_arch = "sm_90"}>
// CHECK-LABEL: func.func @main
// CHECK: call @layer1(%arg0, %arg1, %arg2)
// CHECK: func.func private @layer1(%arg0: tensor<2x8xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16xf32>) -> tensor<2x16xf32> attributes {collage.backend = "triton", collage.region = "layer1"} {
// CHECK-NEXT: %[[OUT:.+]] = tensor.empty() : tensor<2x16xf32>
// CHECK-NEXT: hal.dispatch.extern "kernel"(%arg0, %arg1, %arg2, %[[OUT]]) : {{.*}} -> %[[OUT]]
// CHECK-NOT: stablehlo.
// CHECK: #executable_target_cuda_nvptx_fb ordinal(0) = [#hal.executable.object<{path = "kernels/layer1.triton.cubin"}>]

// Built: Triton's entry point, one 64 x 64 tile (2 x 16 output), 4 warps, the two scratch pointers bound
// to a placeholder after the output, the dynamic shared memory Triton asked for.
// BUILT: %[[OUT:.+]] = tensor.empty() : tensor<2x16xf32>
// BUILT: %[[SCRATCH:.+]] = arith.constant dense<0> : tensor<16xi8>
// BUILT: hal.dispatch.extern "gemm"(%arg0, %arg1, %arg2, %[[OUT]], %[[SCRATCH]], %[[SCRATCH]])
// BUILT: hal.return %c1, %c1{{.*}}, %c1{{.*}} : index, index, index
// BUILT: <workgroup_size = [128 : index, 1 : index, 1 : index], workgroup_local_memory = {{[0-9]+}}>

// META: {'object': 'layer1.triton.cubin', 'export': 'gemm', 'grid': [1, 1, 1], 'block': [128, 1, 1], {{.*}}'trailing_pointers': 2, 'spec': {'kind': 'gemm', 'batch': 1, 'm': 2, 'n': 16, 'k': 8, 'trans_b': False, 'element': 'f32', 'bias': 16, 'residual': False, 'act': 'relu'}, 'compiler': 'triton-{{.*}}'}

// NOARCH: collage-opt: error: {{.*}}mlp.mlir:4:8: backend 'triton' runs kernels in cuda programs only; this one has no kernel architecture (collage-lower's kernel-arch option)
