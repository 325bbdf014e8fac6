/* The learnable temperature's pass over one block of rows, fused (``_temperature_grad.py``).
 *
 * For each row i of a block of dot products x (row i against every key, unit column stride),
 * the logits' scale, one level's key labels lab[k] and weights w[k] (w_k > 0 exactly on the
 * level's keys) and the row's own label g_i:
 *
 *     s_k  = scale * x_k                 (the dot first, then the scale, as the reference)
 *     M    = max of s_k over the level's keys
 *     e_k  = exp(s_k - M)                (0 below e^-87: no denormal number)
 *     den  = sum_k w_k e_k               = exp(LSE_i - M)
 *     a    = sum_k w_k e_k (s_k - M)     (den * sum_k p_ik (s_ik - M))
 *     pos  = sum over the positives k (lab_k == g_i, k != self) of q_k (s_k - M),
 *            q_k = 1 (exact variant) or e_k / (e_k + eps) (official)
 *
 * float sums over chunks of CHUNK entries, theirs in float64. The torch path
 * (``_torch_row_terms``) takes ~ten passes over a block that does not fit in cache; here a row
 * is read from memory once for its max and stays in L1/L2 for the rest. The exp is
 * _native_math.h's branch-free polynomial, so the loops vectorise. Compiled on first use by
 * ``_native.py`` (plain C99, no Python or torch headers).
 */
/* No contraction of s = x * scale and d = s - m into one fma(x, scale, -m): that skips s's
 * rounding, and the arg-max key's d became its rounding error instead of 0 (e^d != 1: den 7e-5
 * relative off at |s| ~ 10^3, a test's find). GCC contracts across statements by default in
 * its gnu modes; clang within an expression. Before the includes: every function here. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <stdint.h>

#include "_native_math.h"
#include "_native_omp.h"

/* below this many entries a block runs on one thread (a fork costs a few us) */
#define PARALLEL_MIN_ENTRIES 32768
#define LOWEST (-87.0f)
/* float sums over chunks of this many entries (8 lanes, 16 terms each: a few ulp of the chunk's
 * sum, whose terms all have one sign), the chunks' sums in float64: vectorised float lanes,
 * not double ones with a conversion per entry (several times slower, untimed as a figure) */
#define CHUNK 128

/* e^d for d <= 0, 0 below e^-87 (no denormal number) */
static inline float exp_or_zero(float d)
{
    const float e = exp_f32(d < LOWEST ? LOWEST : d);
    return d < LOWEST ? 0.0f : e;
}

static void row_terms(int64_t n, const float *x, float scale, const int32_t *lab, const float *w,
                      int32_t own, int64_t self, int official, float eps, double *out)
{
    float m = -3.4028234663852886e38f;          /* the level's keys: w > 0 */
#pragma omp simd reduction(max:m)
    for (int64_t k = 0; k < n; k++) {
        const float s = x[k] * scale;
        m = w[k] > 0.0f && s > m ? s : m;
    }
    double den = 0.0, a = 0.0, pos = 0.0;
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < n ? c0 + CHUNK : n;
        float dc = 0.0f, ac = 0.0f, pc = 0.0f;
        if (official) {
#pragma omp simd reduction(+:dc, ac, pc)
            for (int64_t k = c0; k < c1; k++) {
                const int in = w[k] > 0.0f;
                const float s = x[k] * scale;
                const float d = in ? s - m : 0.0f;              /* <= 0 on the keys */
                const float e = exp_or_zero(d);
                const float we = w[k] * e;
                dc += we;
                ac += we * d;
                pc += in && lab[k] == own ? e / (e + eps) * d : 0.0f;
            }
        } else {
#pragma omp simd reduction(+:dc, ac, pc)
            for (int64_t k = c0; k < c1; k++) {
                const int in = w[k] > 0.0f;
                const float s = x[k] * scale;
                const float d = in ? s - m : 0.0f;
                const float we = w[k] * exp_or_zero(d);
                dc += we;
                ac += we * d;
                pc += in && lab[k] == own ? d : 0.0f;
            }
        }
        den += dc;
        a += ac;
        pos += pc;
    }
    if (self >= 0 && w[self] > 0.0f && lab[self] == own) {   /* not its own positive */
        const float s = x[self] * scale;
        const float d = s - m;
        const float e = exp_or_zero(d);
        pos -= official ? e / (e + eps) * d : d;
    }
    out[0] = a;
    out[1] = den;
    out[2] = pos;
}

/* rows x n block x (row stride ldx); lab[n], w[n]: the level's key labels and weights (w > 0
 * exactly on the level's keys); own[rows]: each row's label; self[rows]: each row's own column
 * (-1: it is its own positive, include_self); out[rows][3]: (a, den, pos). threads > 1: the
 * rows are split over the OpenMP threads (torch's own, see ``_native.py``); rows are
 * independent, so the result is the same bit for bit on any thread count. Returns the number
 * of threads that ran. */
int64_t hiertail_temperature_rows_f32(int64_t threads, int64_t rows, int64_t n, const float *x,
                                      int64_t ldx, float scale, const int32_t *lab,
                                      const float *w, const int32_t *own, const int64_t *self,
                                      int64_t official, float eps, double *out)
{
    int64_t used = 1;
    if (threads < 1 || rows * n < PARALLEL_MIN_ENTRIES)
        threads = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        if (THREAD_NUM() == 0)
            used = NUM_THREADS();
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows; i++)
            row_terms(n, x + i * ldx, scale, lab, w, own[i], self[i], official != 0, eps,
                      out + 3 * i);
    }
    return used;
}
