/* The official variant's positive pairs of one row block, fused: one pass over each positive
 * entry (``_positive_blocks.py`` has the math; DESIGN.md section 3).
 *
 * For row i of the block and level k, the positives are the common-key columns
 * [lo[k][i], hi[k][i]) of the block (keys sorted by label: a group is one column range); with
 * x = e[i][j] (exp(s_ij - M_i), the forward values) and the official eps:
 *
 *     T[k][i] += sum_j log(x + eps)          Q[k][i] += sum_j q,  q = x / (x + eps)
 *     target[i][j] += (sum over the levels k holding j of coef[k][i]) * q
 *
 * skipping j = self_col[i] (the row's own key when include_self is false; -1: none). With a
 * per-row factor fac (rows whose max M_i is a level-specific key: x = e * f_i, f_i < 1; one
 * level per call), x = e * fac[i], and x <= cut becomes exactly 0 (the engine's exp cut-off:
 * no denormal enters the arithmetic). The eager
 * path runs six passes over every positive entry (x + eps, the division, log, two row sums,
 * addcmul) and a few dozen torch calls per group; here each entry is read once and the target
 * written once, and all levels share it: the row's ranges split its union into segments with
 * one set of levels each (nested levels: 2K - 1 segments at most), each segment one vectorised
 * loop whose sums go to every level holding it.
 *
 * target may alias e (the folded single-level gradient block): entry j is read before it is
 * written, in the same iteration. Sums are accumulated in double per (row, segment).
 * Compiled on first use by ``_native.py`` (plain C99, no Python or torch headers).
 */
#include <stdint.h>
#include <math.h>

#define MAX_LEVELS 16

/* Threads (_native_omp.h): the row loop runs on torch's OpenMP threads when the block has at
 * least min_entries entries in its ranges; the kernel returns the number of threads that ran. */
#include "_native_omp.h"

/* Natural log for a in [2^-126, 2^127] (normal, positive): a = 2^e * (1 + m), m in [-1/3, 1/3),
 * log(1 + m) = m - m^2/2 + m^3 P(m), P of degree 8 fitted to log1p on that interval (relative
 * error 1e-9 in exact arithmetic; ~1 ulp in float). Branch-free, so the loops vectorise (a libm
 * call would not). The positives only ever take it of x + eps in [eps, 1 + eps]. */
static inline float log_f32(float a)
{
    union { float f; int32_t i; } u = { a };
    int32_t e = (u.i - 0x3f2aaaab) >> 23;          /* a / 2^e in [2/3, 4/3) */
    u.i -= (int32_t)((uint32_t)e << 23);
    float m = u.f - 1.0f;
    float p = 1.169969230e-01f;
    p = p * m - 1.285212925e-01f;
    p = p * m + 1.083586870e-01f;
    p = p * m - 1.219399051e-01f;
    p = p * m + 1.429704904e-01f;
    p = p * m - 1.667972320e-01f;
    p = p * m + 1.999985844e-01f;
    p = p * m - 2.499981656e-01f;
    p = p * m + 3.333333300e-01f;
    float m2 = m * m;
    float r = m - 0.5f * m2 + m2 * m * p;
    return (float)e * 6.93147182e-01f + r;
}

void hiertail_log_f32(int64_t n, const float *a, float *out)     /* for the accuracy test */
{
    for (int64_t j = 0; j < n; j++)
        out[j] = log_f32(a[j]);
}

#define POSITIVES_KERNEL(NAME, T, LOG)                                                        \
int64_t NAME(int64_t threads, int64_t min_entries, int64_t rows, int64_t levels, const T *x,  \
             int64_t ldx, T *target, int64_t ldt, const int64_t *lo, const int64_t *hi,       \
             int64_t ld_range, const int64_t *self_col, const T *coef, int64_t ld_coef,       \
             double eps, const T *fac, double cut, T *t_out, T *q_out, int64_t ld_out)        \
{                                                                                             \
    const T eps_t = (T)eps, cut_t = (T)cut;                                                   \
    int64_t entries = 0, used = 1;                                                            \
    for (int64_t k = 0; k < levels; k++)                                                      \
        for (int64_t i = 0; i < rows; i++) {                                                  \
            const int64_t w = hi[k * ld_range + i] - lo[k * ld_range + i];                    \
            entries += w > 0 ? w : 0;                                                         \
        }                                                                                     \
    if (threads < 1 || entries < min_entries)                                                 \
        threads = 1;                                                                          \
    _Pragma("omp parallel num_threads(threads) if (threads > 1)")                             \
    {                                                                                         \
    if (THREAD_NUM() == 0)                                                                    \
        used = NUM_THREADS();                                                                 \
    /* rows differ in work (their groups' sizes): dynamic chunks of rows */                   \
    _Pragma("omp for schedule(dynamic, 8)")                                                   \
    for (int64_t i = 0; i < rows; i++) {                                                      \
        const T f = fac ? fac[i] : (T)1;                                                      \
        int64_t l0[MAX_LEVELS], h0[MAX_LEVELS], cut[2 * MAX_LEVELS + 2];                      \
        double st_k[MAX_LEVELS], sq_k[MAX_LEVELS];                                            \
        int n_cut = 0;                                                                        \
        for (int64_t k = 0; k < levels; k++) {                                                \
            l0[k] = lo[k * ld_range + i];                                                     \
            h0[k] = hi[k * ld_range + i];                                                     \
            st_k[k] = 0.0;                                                                    \
            sq_k[k] = 0.0;                                                                    \
            if (l0[k] < h0[k]) {                                                              \
                cut[n_cut++] = l0[k];                                                         \
                cut[n_cut++] = h0[k];                                                         \
            }                                                                                 \
        }                                                                                     \
        if (n_cut == 0)                                                                       \
            continue;                                                                         \
        const int64_t self = self_col ? self_col[i] : -1;                                     \
        if (self >= 0) {                                                                      \
            cut[n_cut++] = self;                                                              \
            cut[n_cut++] = self + 1;                                                          \
        }                                                                                     \
        for (int a = 1; a < n_cut; a++) {               /* insertion sort: a few values */    \
            int64_t v = cut[a];                                                               \
            int b = a - 1;                                                                    \
            while (b >= 0 && cut[b] > v) {                                                    \
                cut[b + 1] = cut[b];                                                          \
                b--;                                                                          \
            }                                                                                 \
            cut[b + 1] = v;                                                                   \
        }                                                                                     \
        const T *xr = x + i * ldx;                                                            \
        T *tr = target ? target + i * ldt : 0;                                                \
        for (int s = 0; s + 1 < n_cut; s++) {                                                 \
            const int64_t j0 = cut[s], j1 = cut[s + 1];                                       \
            if (j1 <= j0 || (j0 == self && j1 == self + 1))                                   \
                continue;                                                                     \
            int member[MAX_LEVELS], any = 0;                                                  \
            T c = 0;                                                                          \
            for (int64_t k = 0; k < levels; k++) {                                            \
                member[k] = l0[k] <= j0 && j1 <= h0[k];                                       \
                any |= member[k];                                                             \
                if (member[k] && tr)                                                          \
                    c += coef[k * ld_coef + i];                                               \
            }                                                                                 \
            if (!any)                                                                         \
                continue;                                                                     \
            double st = 0.0, sq = 0.0;                                                        \
            if (tr) {                                                                         \
                _Pragma("omp simd reduction(+:st, sq)")                                       \
                for (int64_t j = j0; j < j1; j++) {                                           \
                    const T fv = xr[j] * f, v = fv > cut_t ? fv : (T)0;                       \
                    const T d = v + eps_t, q = v / d;                                         \
                    st += (double)LOG(d);                                                     \
                    sq += (double)q;                                                          \
                    tr[j] += c * q;                                                           \
                }                                                                             \
            } else {                                                                          \
                _Pragma("omp simd reduction(+:st, sq)")                                       \
                for (int64_t j = j0; j < j1; j++) {                                           \
                    const T fv = xr[j] * f, v = fv > cut_t ? fv : (T)0;                       \
                    const T d = v + eps_t;                                                    \
                    st += (double)LOG(d);                                                     \
                    sq += (double)(v / d);                                                    \
                }                                                                             \
            }                                                                                 \
            for (int64_t k = 0; k < levels; k++)                                              \
                if (member[k]) {                                                              \
                    st_k[k] += st;                                                            \
                    sq_k[k] += sq;                                                            \
                }                                                                             \
        }                                                                                     \
        for (int64_t k = 0; k < levels; k++)                                                  \
            if (l0[k] < h0[k]) {                                                              \
                t_out[k * ld_out + i] += (T)st_k[k];                                          \
                q_out[k * ld_out + i] += (T)sq_k[k];                                          \
            }                                                                                 \
    }                                                                                         \
    }                                                                                         \
    return used;                                                                              \
}

POSITIVES_KERNEL(hiertail_positives_f32, float, log_f32)
POSITIVES_KERNEL(hiertail_positives_f64, double, log)
