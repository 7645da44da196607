// The activations the GLSL kernels apply to their result (one of ACT_RELU, ACT_GELU, ACT_GELU_TANH,
// ACT_SIGMOID, ACT_SWISH, ACT_TANH defined, else none): put before each kernel's text by the `glsl` backend.
float act(float x) {
#if defined(ACT_RELU)
  return max(x, 0.0);
#elif defined(ACT_GELU)
  // erf by Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7); GLSL has no erf.
  float z = abs(x) * 0.7071067811865476;
  float t = 1.0 / (1.0 + 0.3275911 * z);
  float e = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-z * z);
  return 0.5 * x * (1.0 + sign(x) * e);
#elif defined(ACT_GELU_TANH)
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
#elif defined(ACT_SIGMOID)
  return 1.0 / (1.0 + exp(-x));
#elif defined(ACT_SWISH)
  return x / (1.0 + exp(-x));
#elif defined(ACT_TANH)
  return tanh(x);
#else
  return x;
#endif
}

