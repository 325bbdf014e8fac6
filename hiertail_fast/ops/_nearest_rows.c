/* Best and second-best entry of each row of a distance block (``nearest_prototype``'s torch
 * backend; ``_nearest_rows.py``).
 *
 * For each row i of a block d [rows, n] (row stride ldd) of expanded distances
 * d_ik = ||p_k||^2 - 2 z_i.p_k:
 *
 *     best_i   = min_k d_ik,   arg_i = its FIRST index (the lowest-index rule),
 *     second_i = min_{k != arg_i} d_ik   (== best_i when the minimum occurs twice; +inf if n = 1)
 *
 * which is what ``topk(2, largest=False)`` gives (up to the order of equal values, which the
 * caller does not use: a zero gap is re-decided by the near-tie refinement anyway). The eager
 * topk sorts candidates per row and was ~40 % of the op's time on the CPU; here a row
 * (n <= 8,192 floats) is read from memory once and stays in L1/L2 for three vectorised passes:
 * its min, the chunk holding the first index of the min, and the min over the other entries.
 * The inputs are finite (checked by the caller), so no NaN ordering questions arise.
 * Compiled on first use by ``_native.py`` (plain C99, no Python or torch headers).
 */
#include <math.h>
#include <stdint.h>

#include "_native_omp.h"

#define ARG_CHUNK 64
/* below this many entries a block runs on one thread (a fork costs a few us) */
#define PARALLEL_MIN_ENTRIES 32768

#define BEST_TWO_ROW(T, NAME)                                                                  \
static void NAME(int64_t n, const T *x, T *best, T *second, int64_t *arg)                     \
{                                                                                              \
    T m = x[0];                                                                                \
    _Pragma("omp simd reduction(min:m)")                                                       \
    for (int64_t k = 0; k < n; k++)                                                            \
        m = x[k] < m ? x[k] : m;                                                               \
    int64_t c0 = 0;              /* the chunk holding the first k with x[k] == m */           \
    for (; c0 < n; c0 += ARG_CHUNK) {                                                          \
        const int64_t c1 = c0 + ARG_CHUNK < n ? c0 + ARG_CHUNK : n;                            \
        int hit = 0;                                                                           \
        _Pragma("omp simd reduction(|:hit)")                                                   \
        for (int64_t k = c0; k < c1; k++)                                                      \
            hit |= x[k] == m;                                                                  \
        if (hit)                                                                               \
            break;                                                                             \
    }                                                                                          \
    int64_t a = c0 < n ? c0 : 0;                                                               \
    while (a < n - 1 && x[a] != m)                                                             \
        a++;                                                                                   \
    T s = (T)INFINITY;                                                                         \
    _Pragma("omp simd reduction(min:s)")                                                       \
    for (int64_t k = 0; k < n; k++) {                                                          \
        const T v = k == a ? (T)INFINITY : x[k];                                               \
        s = v < s ? v : s;                                                                     \
    }                                                                                          \
    *best = m;                                                                                 \
    *second = s;                                                                               \
    *arg = a;                                                                                  \
}

#define BEST_TWO_BLOCK(T, NAME, ROW)                                                           \
int64_t NAME(int64_t threads, int64_t rows, int64_t n, const T *d, int64_t ldd, T *best,       \
             T *second, int64_t *arg)                                                          \
{                                                                                              \
    int64_t used = 1;                                                                          \
    if (threads < 1 || rows * n < PARALLEL_MIN_ENTRIES)                                        \
        threads = 1;                                                                           \
    _Pragma("omp parallel num_threads(threads) if (threads > 1)")                              \
    {                                                                                          \
        if (THREAD_NUM() == 0)                                                                 \
            used = NUM_THREADS();                                                              \
        _Pragma("omp for schedule(static)")                                                    \
        for (int64_t i = 0; i < rows; i++)                                                     \
            ROW(n, d + i * ldd, best + i, second + i, arg + i);                                \
    }                                                                                          \
    return used;        /* the number of threads that ran */                                   \
}

BEST_TWO_ROW(float, row_f32)
BEST_TWO_ROW(double, row_f64)
/* rows independent: the same result bit for bit on any thread count */
BEST_TWO_BLOCK(float, hiertail_best_two_f32, row_f32)
BEST_TWO_BLOCK(double, hiertail_best_two_f64, row_f64)
