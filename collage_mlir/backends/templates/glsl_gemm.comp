// A batched GEMM with a fused epilogue as a Vulkan compute shader, specialised by the #defines the
// `glsl` backend puts before this text (M, N, K, TRANS_B, HAS_BIAS, BIAS_SCALAR, RESIDUAL, ACT_*, TILE):
// out[b] = act(a[b] @ op(w[b]) + bias + residual[b]), accumulated in f32. One TILE x TILE block of
// the output a workgroup, one element a thread; grid (n tiles, m tiles, batch). Bindings in order:
// a, w, [bias], [residual], out.

layout(local_size_x = TILE, local_size_y = TILE, local_size_z = 1) in;

layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer W { float w[]; };
#if HAS_BIAS
layout(set = 0, binding = 2) readonly buffer Bias { float bias[]; };
#endif
#if RESIDUAL
layout(set = 0, binding = 2 + HAS_BIAS) readonly buffer Res { float res[]; };
#endif
layout(set = 0, binding = 2 + HAS_BIAS + RESIDUAL) buffer Out { float outv[]; };

shared float ta[TILE][TILE];
shared float tw[TILE][TILE];

void main() {
  uint col = gl_WorkGroupID.x * TILE + gl_LocalInvocationID.x;
  uint row = gl_WorkGroupID.y * TILE + gl_LocalInvocationID.y;
  uint b = gl_WorkGroupID.z;
  float acc = 0.0;
  for (uint k0 = 0; k0 < K; k0 += TILE) {
    uint ka = k0 + gl_LocalInvocationID.x;  // the a tile: row, ka
    uint kw = k0 + gl_LocalInvocationID.y;  // the w tile: kw, col
    ta[gl_LocalInvocationID.y][gl_LocalInvocationID.x] = (row < M && ka < K) ? a[b * M * K + row * K + ka] : 0.0;
#if TRANS_B
    tw[gl_LocalInvocationID.y][gl_LocalInvocationID.x] = (kw < K && col < N) ? w[b * N * K + col * K + kw] : 0.0;
#else
    tw[gl_LocalInvocationID.y][gl_LocalInvocationID.x] = (kw < K && col < N) ? w[b * K * N + kw * N + col] : 0.0;
#endif
    barrier();
    for (uint k = 0; k < TILE; ++k) {
      acc += ta[gl_LocalInvocationID.y][k] * tw[k][gl_LocalInvocationID.x];
    }
    barrier();
  }
  if (row < M && col < N) {
#if HAS_BIAS && BIAS_SCALAR
    acc += bias[0];
#elif HAS_BIAS
    acc += bias[col];
#endif
#if RESIDUAL
    acc += res[b * M * N + row * N + col];
#endif
    outv[b * M * N + row * N + col] = act(acc);
  }
}
