// A 2-D convolution with a fused epilogue as a Vulkan compute shader, specialised by the #defines the
// `glsl` backend puts before this text (shapes N, C, H, W, K, R, S, OH, OW; SH, SW, PH, PW, DH, DW;
// GROUPS; element strides XN XC XH XW, WO WI WR WS, YN YC YH YW; HAS_BIAS, BIAS_SCALAR, RESIDUAL, ACT_*):
// y = act(conv2d(x, w) + bias + residual), accumulated in f32, every tensor addressed through its strides
// (NCHW, NHWC, any layout read in place). Direct: one output element a thread, 64 a workgroup. Bindings in
// order: x, w, [bias], [residual], y.

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Wt { float w[]; };
#if HAS_BIAS
layout(set = 0, binding = 2) readonly buffer Bias { float bias[]; };
#endif
#if RESIDUAL
layout(set = 0, binding = 2 + HAS_BIAS) readonly buffer Res { float res[]; };
#endif
layout(set = 0, binding = 2 + HAS_BIAS + RESIDUAL) buffer Out { float y[]; };

void main() {
  uint idx = gl_GlobalInvocationID.x;
  if (idx >= N * K * OH * OW) {
    return;
  }
  uint ox = idx % OW;
  uint oy = (idx / OW) % OH;
  uint ko = (idx / (OW * OH)) % K;
  uint nb = idx / (OW * OH * K);
  uint cg = C / GROUPS;
  uint g = ko / (K / GROUPS);
  float acc = 0.0;
  for (uint ci = 0; ci < cg; ++ci) {
    for (uint ry = 0; ry < R; ++ry) {
      int iy = int(oy * SH + ry * DH) - int(PH);
      if (iy < 0 || iy >= int(H)) {
        continue;
      }
      for (uint rx = 0; rx < S; ++rx) {
        int ix = int(ox * SW + rx * DW) - int(PW);
        if (ix < 0 || ix >= int(W)) {
          continue;
        }
        acc += x[nb * XN + (g * cg + ci) * XC + uint(iy) * XH + uint(ix) * XW] * w[ko * WO + ci * WI + ry * WR + rx * WS];
      }
    }
  }
  uint out_at = nb * YN + ko * YC + oy * YH + ox * YW;
#if HAS_BIAS && BIAS_SCALAR
  acc += bias[0];
#elif HAS_BIAS
  acc += bias[ko];
#endif
#if RESIDUAL
  acc += res[out_at];
#endif
  y[out_at] = act(acc);
}
