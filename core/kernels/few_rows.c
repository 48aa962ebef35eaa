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

/* A weight element as float32: W_T is float (the weights as they are) or unsigned short (the
 * upper half of float32 weights that are exactly bfloat16 values: the same numbers, half the
 * bytes to read). Every product and sum is then the same, in the same order, for both. */
static inline float w_at(const float *w, long k) { return w[k]; }
static inline float w16_at(const unsigned short *w, long k) {
    union { unsigned int u; float f; } v;
    v.u = (unsigned int)w[k] << 16;
    return v.f;
}
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 w_load(const float *w) { return _mm256_loadu_ps(w); }
static inline __m256 w16_load(const unsigned short *w) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define FEW_ROWS_SIMD(W_LOAD)                                                                                     \
    __m256 acc[GROUP];                                                                                            \
    for (long i = 0; i < n; ++i) acc[i] = _mm256_setzero_ps();                                                    \
    for (; k + 8 <= K; k += 8) {                                                                                  \
        const __m256 wv = W_LOAD(wj + k);                                                                         \
        for (long i = 0; i < n; ++i) acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * K + k), acc[i]);       \
    }                                                                                                             \
    for (long i = 0; i < n; ++i) {                                                                                \
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));                  \
        s = _mm_hadd_ps(s, s);                                                                                    \
        s = _mm_hadd_ps(s, s);                                                                                    \
        sums[i] = _mm_cvtss_f32(s);                                                                               \
    }
#else
#define FEW_ROWS_SIMD(W_LOAD) for (long i = 0; i < n; ++i) sums[i] = 0.0f;
#endif

/* The tail's multiply-add, one rounding or two, the same for every weight type */
#if defined(__FMA__)
#define FEW_ROWS_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define FEW_ROWS_FMA(a, b, c) ((c) + (a) * (b))
#endif

/* One block of weight rows j0..j1 for n rows of x (W_T: the weights' element type). */
#define FEW_ROWS_BLOCK(NAME, W_T, W_LOAD, W_AT)                                                                  \
    static inline __attribute__((always_inline)) void NAME(const float *x, const W_T *w, const float *b,        \
                                                           float *y, const long n, long K, long N, long j0,       \
                                                           long j1) {                                             \
        for (long j = j0; j < j1; ++j) {                                                                          \
            const W_T *wj = w + j * K;                                                                            \
            float sums[GROUP];                                                                                    \
            long k = 0;                                                                                           \
            FEW_ROWS_SIMD(W_LOAD)                                                                                 \
            for (; k < K; ++k) {                                                                                  \
                const float wk = W_AT(wj, k);                                                                     \
                for (long i = 0; i < n; ++i) sums[i] = FEW_ROWS_FMA(wk, x[i * K + k], sums[i]);                   \
            }                                                                                                     \
            for (long i = 0; i < n; ++i) y[i * N + j] = b ? sums[i] + b[j] : sums[i];                             \
        }                                                                                                         \
    }

FEW_ROWS_BLOCK(block, float, w_load, w_at)
FEW_ROWS_BLOCK(block16, unsigned short, w16_load, w16_at)

/* The loop over tasks for one weight type: BLOCK is block or block16. */
#define FEW_ROWS_BODY(BLOCK)                                                                                      \
    if (n < 1 || n > FEW_ROWS_MAX) return 1;                                                                      \
    const long tasks = (N + ROWS_PER_TASK - 1) / ROWS_PER_TASK;                                                   \
    _Pragma("omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= 65536)")         \
    for (long t = 0; t < tasks; ++t) {                                                                            \
        const long j0 = t * ROWS_PER_TASK, j1 = j0 + ROWS_PER_TASK < N ? j0 + ROWS_PER_TASK : N;                 \
        for (long g = 0; g < n; g += GROUP) {                                                                     \
            const float *xg = x + g * K;                                                                          \
            float *yg = y + g * N;                                                                                \
            /* a constant row count per case lets the compiler keep the accumulators in registers */             \
            switch (n - g < GROUP ? n - g : GROUP) {                                                              \
            case 1: BLOCK(xg, w, b, yg, 1, K, N, j0, j1); break;                                                  \
            case 2: BLOCK(xg, w, b, yg, 2, K, N, j0, j1); break;                                                  \
            case 3: BLOCK(xg, w, b, yg, 3, K, N, j0, j1); break;                                                  \
            case 4: BLOCK(xg, w, b, yg, 4, K, N, j0, j1); break;                                                  \
            case 5: BLOCK(xg, w, b, yg, 5, K, N, j0, j1); break;                                                  \
            case 6: BLOCK(xg, w, b, yg, 6, K, N, j0, j1); break;                                                  \
            case 7: BLOCK(xg, w, b, yg, 7, K, N, j0, j1); break;                                                  \
            default: BLOCK(xg, w, b, yg, 8, K, N, j0, j1); break;                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
    return 0;

/* x: n x K, w: N x K, b: N or NULL, y: n x N, all contiguous float32; 1 <= n <= FEW_ROWS_MAX.
 * threads: OpenMP threads (the caller passes torch's count; torch's own libgomp serves them).
 * Each task reads its weight rows from memory once: more than GROUP rows of x take a second
 * pass over them, which finds them in cache. */
int few_rows_linear(const float *x, const float *w, const float *b, float *y, long n, long K, long N, int threads) {
    FEW_ROWS_BODY(block)
}

/* The same with w as bfloat16 bits (N x K unsigned shorts): for float32 weights that are all
 * exactly bfloat16 values, the result equals few_rows_linear's bit for bit. */
int few_rows_linear_bf16(const float *x, const unsigned short *w, const float *b, float *y, long n, long K, long N,
                         int threads) {
    FEW_ROWS_BODY(block16)
}

int few_rows_max(void) { return FEW_ROWS_MAX; }
