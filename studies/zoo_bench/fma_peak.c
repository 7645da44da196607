// FP32 FMA peak of this CPU, the ceiling the bench's GFLOP/s are read against: per thread, 16 independent
// 512-bit FMA chains (enough to fill two FMA pipes of 4-cycle latency). AVX-512 machines only.
//   gcc -O3 -march=native -pthread bench/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak 2
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define ITERS 200000000L
static void *work(void *out) {
  __m512 acc[16], m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
  for (long k = 0; k < ITERS; k++)
    for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  float s = 0; for (int i = 0; i < 16; i++) s += _mm512_reduce_add_ps(acc[i]);
  *(float *)out = s; return NULL;
}
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2; pthread_t t[8]; float r[8];
  struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, work, &r[i]);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
  double flop = 2.0 * 16 * 16 * ITERS * n;
  printf("%d threads: %.0f GFLOP/s (%.3f s, checksum %g)\n", n, flop / s / 1e9, s, r[0]);
  return 0;
}
