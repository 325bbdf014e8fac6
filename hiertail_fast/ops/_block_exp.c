/* The common-column step of the CPU engine's row block, fused (``_lse_torch._engine``).
 *
 * For each row i of a block of dot products e (in place), with the cut-off C of the engine
 * (terms below e^-C of the row's largest are exactly 0: no denormal ever reaches a GEMM):
 *
 *     s_ik     = scale * e_ik                 (the dot first, then the scale: the reference's
 *                                             rounding of (z_i . z_k) / tau, not (scale z_i) . z_k)
 *     m_i      = max_k s_ik                   (arg_i = its FIRST index, if asked: torch.max's rule;
 *                                             with ids: the SMALLEST ids[k] among the maxima,
 *                                             for columns that are not in key order)
 *     e_ik     = exp(max(s_ik - m_i, -C)), then 0 where <= thr (thr = e^-C * 1.0001)
 *     sums[l][i] = sum_k w[l][k] * e_ik        (float64 accumulation, l < levels)
 *
 * The eager path is an amax (or a two-level arg-max search), sub_, clamp_, exp_, threshold_ and
 * a [b, N] x [N, L] product: six passes over a block that does not fit in cache. Here a row
 * (24 KB at N = 6,000) is read from memory once, for its max, and stays in L1/L2 for the exp
 * and the sums. The exp is a branch-free polynomial (vectorises; <= 1.5 ulp against float64 on
 * [-87, 0], tested), so the loop runs at SIMD width where libm's expf would not.
 * Compiled on first use by ``_native.py`` (plain C99, no Python or torch headers).
 */
#include <stdint.h>

#include "_native_math.h"
#include "_native_omp.h"

#define ARG_CHUNK 64
/* below this many entries a block runs on one thread (a fork costs a few us) */
#define PARALLEL_MIN_ENTRIES 32768

void hiertail_exp_f32(int64_t n, const float *a, float *out)     /* for the accuracy test */
{
    for (int64_t j = 0; j < n; j++)
        out[j] = exp_f32(a[j]);
}

/* One row: the logits scaled in place (x <- scale x: the dot product first, then the scale,
 * as the dense reference's (z_i . z_k) / tau rounds them), their max (and first arg-max), the
 * exp in place, the weighted sums. */
static void row_step(int64_t n, float *x, float scale, float cutoff, float thr, int64_t levels,
                     const float *w, int64_t ldw, float *m_out, int64_t *arg_out,
                     const int64_t *ids, double *sums, int64_t ld_sums)
{
    float m = x[0] * scale;
#pragma omp simd reduction(max:m)
    for (int64_t k = 0; k < n; k++) {
        const float v = x[k] * scale;
        x[k] = v;
        m = v > m ? v : m;
    }
    *m_out = m;
    if (arg_out && ids) {          /* the smallest id among the maxima (row in L1 now) */
        int64_t best = INT64_MAX;
#pragma omp simd reduction(min:best)
        for (int64_t k = 0; k < n; k++) {
            const int64_t c = x[k] == m ? ids[k] : INT64_MAX;
            best = c < best ? c : best;
        }
        *arg_out = best != INT64_MAX ? best : ids[0];   /* (no hit: only for a NaN max) */
    } else if (arg_out) {          /* first k with x[k] == m: find its chunk vectorised */
        int64_t c0 = 0;
        for (; c0 < n; c0 += ARG_CHUNK) {
            const int64_t c1 = c0 + ARG_CHUNK < n ? c0 + ARG_CHUNK : n;
            int hit = 0;
#pragma omp simd reduction(|:hit)
            for (int64_t k = c0; k < c1; k++)
                hit |= x[k] == m;
            if (hit)
                break;
        }
        int64_t a = c0 < n ? c0 : 0;   /* (no hit: only for a NaN max) */
        while (a < n - 1 && x[a] != m)
            a++;
        *arg_out = a;
    }
    const float lo = -cutoff;
    if (levels == 1) {             /* one level: the sum in the same loop */
        double acc = 0.0;
#pragma omp simd reduction(+:acc)
        for (int64_t k = 0; k < n; k++) {
            float v = x[k] - m;
            v = v < lo ? lo : v;
            v = exp_f32(v);
            v = v <= thr ? 0.0f : v;
            x[k] = v;
            acc += (double)(w[k] * v);
        }
        sums[0] = acc;
        return;
    }
#pragma omp simd
    for (int64_t k = 0; k < n; k++) {
        float v = x[k] - m;
        v = v < lo ? lo : v;
        v = exp_f32(v);
        x[k] = v <= thr ? 0.0f : v;
    }
    for (int64_t l = 0; l < levels; l++) {   /* the row is in L1/L2 now */
        const float *wl = w + l * ldw;
        double acc = 0.0;
#pragma omp simd reduction(+:acc)
        for (int64_t k = 0; k < n; k++)
            acc += (double)(wl[k] * x[k]);
        sums[l * ld_sums] = acc;
    }
}

/* rows x n block e (row stride lde), weights w [levels][ldw]; outputs m_out[rows],
 * arg_out[rows] (NULL: no arg-max), ids[n] (NULL: the arg-max is a column index; else the
 * smallest ids[k] among a row's maxima), sums[levels][ld_sums]. threads > 1: the rows are split over
 * the OpenMP threads (torch's own, see ``_native.py``); rows are independent, so the result is
 * the same bit for bit on any thread count. */
int64_t hiertail_block_exp_f32(int64_t threads, int64_t rows, int64_t n, float *e,
                               int64_t lde, float scale, float cutoff, float thr, int64_t levels,
                               const float *w, int64_t ldw, float *m_out, int64_t *arg_out,
                               const int64_t *ids,
                               double *sums, int64_t ld_sums)
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
            row_step(n, e + i * lde, scale, cutoff, thr, levels, w, ldw, m_out + i,
                     arg_out ? arg_out + i : (int64_t *)0, ids, sums + i, ld_sums);
    }
    return used;        /* the number of threads that ran */
}
