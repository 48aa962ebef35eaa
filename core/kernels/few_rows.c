/* y = x W^T (+ b) for a few rows of x: each weight row is read from memory once and used for
 * every row of x while it is in registers. BLAS GEMM kernels pack (copy) weight panels first,
 * which for 2-8 rows roughly doubles the traffic of a product that is bound by memory; see
 * few_rows.py. Each y[i, j] is summed in the same order whatever the number of rows or
 * threads, so a row's result does not depend on the rows that share the call. */
#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define FEW_ROWS_MAX 16 /* rows per call */
#define GROUP 8           /* rows per pass over a task's weight rows (their accumulators fit the registers) */
#define ROWS_PER_TASK 16  /* weight rows per task: small enough to stay in L2 between the groups */

static inline __attribute__((always_inline)) void block(const float *x, const float *w, const float *b, float *y,
                                                        const long n, long K, long N, long j0, long j1) {
    for (long j = j0; j < j1; ++j) {
        const float *wj = w + j * K;
        float sums[GROUP];
        long k = 0;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc[GROUP];
        for (long i = 0; i < n; ++i) acc[i] = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) {
            const __m256 wv = _mm256_loadu_ps(wj + k);
            for (long i = 0; i < n; ++i) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * K + k), acc[i]);
        }
        for (long i = 0; i < n; ++i) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
            s = _mm_hadd_ps(s, s);
            s = _mm_hadd_ps(s, s);
            sums[i] = _mm_cvtss_f32(s);
        }
#else
        for (long i = 0; i < n; ++i) sums[i] = 0.0f;
#endif
        for (; k < K; ++k)
            for (long i = 0; i < n; ++i) sums[i] += wj[k] * x[i * K + k];
        for (long i = 0; i < n; ++i) y[i * N + j] = b ? sums[i] + b[j] : sums[i];
    }
}

/* x: n x K, w: N x K, b: N or NULL, y: n x N, all contiguous float32; 1 <= n <= FEW_ROWS_MAX.
 * threads: OpenMP threads (the caller passes torch's count; torch's own libgomp serves them).
 * Each task reads its weight rows from memory once: more than GROUP rows of x take a second
 * pass over them, which finds them in cache. */
int few_rows_linear(const float *x, const float *w, const float *b, float *y, long n, long K, long N, int threads) {
    if (n < 1 || n > FEW_ROWS_MAX) return 1;
    const long tasks = (N + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= 65536)
    for (long t = 0; t < tasks; ++t) {
        const long j0 = t * ROWS_PER_TASK, j1 = j0 + ROWS_PER_TASK < N ? j0 + ROWS_PER_TASK : N;
        for (long g = 0; g < n; g += GROUP) {
            const float *xg = x + g * K;
            float *yg = y + g * N;
            /* a constant row count per case lets the compiler keep the accumulators in registers */
            switch (n - g < GROUP ? n - g : GROUP) {
            case 1: block(xg, w, b, yg, 1, K, N, j0, j1); break;
            case 2: block(xg, w, b, yg, 2, K, N, j0, j1); break;
            case 3: block(xg, w, b, yg, 3, K, N, j0, j1); break;
            case 4: block(xg, w, b, yg, 4, K, N, j0, j1); break;
            case 5: block(xg, w, b, yg, 5, K, N, j0, j1); break;
            case 6: block(xg, w, b, yg, 6, K, N, j0, j1); break;
            case 7: block(xg, w, b, yg, 7, K, N, j0, j1); break;
            default: block(xg, w, b, yg, 8, K, N, j0, j1); break;
            }
        }
    }
    return 0;
}

int few_rows_max(void) { return FEW_ROWS_MAX; }
