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
 * skipping j = self_col[i] (the row's own key when include_self is false; -1: none). With
 * factors fac[k][i] (a row whose max M_i at level k is a level-specific key: x = e * f, f < 1;
 * 1 elsewhere), level k sees x = e * fac[k][i], and x <= cut becomes exactly 0 (the engine's
 * exp cut-off: no denormal enters the arithmetic). The eager
 * path runs six passes over every positive entry (x + eps, the division, log, two row sums,
 * addcmul) and a few dozen torch calls per group; here each entry is read once and the target
 * written once, and all levels share it: the row's ranges split its union into segments with
 * one set of levels each (nested levels: 2K - 1 segments at most), each segment one vectorised
 * loop whose sums go to every level holding it (one loop per distinct factor among them).
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
#include "_native_math.h"
#include "_native_omp.h"

void hiertail_log_f32(int64_t n, const float *a, float *out)     /* for the accuracy test */
{
    for (int64_t j = 0; j < n; j++)
        out[j] = log_f32(a[j]);
}

/* One vectorised pass over the row's entries [j0, j1) with factor f: x = xr[j] * f (0 at or
 * below cut), sums of log(x + eps) and q = x / (x + eps) into *st, *sq, and c * q added to
 * tr[j] (tr NULL: forward only). tr may alias xr: entry j is read before it is written. */
#define SEGMENT_PASS(NAME, T, LOG)                                                            \
static inline void NAME(const T *xr, T *tr, int64_t j0, int64_t j1, T f, T cut, T eps, T c,   \
                        double *st_out, double *sq_out)                                       \
{                                                                                             \
    double st = 0.0, sq = 0.0;                                                                \
    if (tr) {                                                                                 \
        _Pragma("omp simd reduction(+:st, sq)")                                               \
        for (int64_t j = j0; j < j1; j++) {                                                   \
            const T fv = xr[j] * f, v = fv > cut ? fv : (T)0;                                 \
            const T d = v + eps, q = v / d;                                                   \
            st += (double)LOG(d);                                                             \
            sq += (double)q;                                                                  \
            tr[j] += c * q;                                                                   \
        }                                                                                     \
    } else {                                                                                  \
        _Pragma("omp simd reduction(+:st, sq)")                                               \
        for (int64_t j = j0; j < j1; j++) {                                                   \
            const T fv = xr[j] * f, v = fv > cut ? fv : (T)0;                                 \
            const T d = v + eps;                                                              \
            st += (double)LOG(d);                                                             \
            sq += (double)(v / d);                                                            \
        }                                                                                     \
    }                                                                                         \
    *st_out = st;                                                                             \
    *sq_out = sq;                                                                             \
}

/* A segment whose levels take DIFFERENT factors while tr aliases xr: one pass reading every
 * entry once for all factor groups (a later group must not read what an earlier one wrote).
 * Scalar over the groups; only rows whose max is a level-specific key at some level but not
 * at all of them come here, and only in an aliased call (which the engine makes with one
 * level, where this never happens). */
#define SEGMENT_PASS_GROUPS(NAME, T, LOG)                                                     \
static void NAME(const T *xr, T *tr, int64_t j0, int64_t j1, int n_grp, const T *f,           \
                 T cut, T eps, const T *c, double *st, double *sq)                            \
{                                                                                             \
    for (int g = 0; g < n_grp; g++)                                                           \
        st[g] = sq[g] = 0.0;                                                                  \
    for (int64_t j = j0; j < j1; j++) {                                                       \
        const T xv = xr[j];                                                                   \
        T acc = 0;                                                                            \
        for (int g = 0; g < n_grp; g++) {                                                     \
            const T fv = xv * f[g], v = fv > cut ? fv : (T)0;                                 \
            const T d = v + eps, q = v / d;                                                   \
            st[g] += (double)LOG(d);                                                          \
            sq[g] += (double)q;                                                               \
            acc += c[g] * q;                                                                  \
        }                                                                                     \
        tr[j] += acc;                                                                         \
    }                                                                                         \
}

#define POSITIVES_KERNEL(NAME, T, PASS, PASS_GROUPS)                                          \
int64_t NAME(int64_t threads, int64_t min_entries, int64_t rows, int64_t levels, const T *x,  \
             int64_t ldx, T *target, int64_t ldt, const int64_t *lo, const int64_t *hi,       \
             int64_t ld_range, const int64_t *self_col, const T *coef, int64_t ld_coef,       \
             double eps, const T *fac, int64_t ld_fac, double cut, T *t_out, T *q_out,        \
             int64_t ld_out)                                                                  \
{                                                                                             \
    const T eps_t = (T)eps, cut_t = (T)cut;                                                   \
    const int aliased = target != 0 && (const T *)target == x && ldt == ldx;                  \
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
        int64_t l0[MAX_LEVELS], h0[MAX_LEVELS], edge[2 * MAX_LEVELS + 2];                     \
        T f_k[MAX_LEVELS];                                                                    \
        double st_k[MAX_LEVELS], sq_k[MAX_LEVELS];                                            \
        int n_edge = 0;                                                                       \
        for (int64_t k = 0; k < levels; k++) {                                                \
            l0[k] = lo[k * ld_range + i];                                                     \
            h0[k] = hi[k * ld_range + i];                                                     \
            f_k[k] = fac ? fac[k * ld_fac + i] : (T)1;                                        \
            st_k[k] = 0.0;                                                                    \
            sq_k[k] = 0.0;                                                                    \
            if (l0[k] < h0[k]) {                                                              \
                edge[n_edge++] = l0[k];                                                       \
                edge[n_edge++] = h0[k];                                                       \
            }                                                                                 \
        }                                                                                     \
        if (n_edge == 0)                                                                      \
            continue;                                                                         \
        const int64_t self = self_col ? self_col[i] : -1;                                     \
        if (self >= 0) {                                                                      \
            edge[n_edge++] = self;                                                            \
            edge[n_edge++] = self + 1;                                                        \
        }                                                                                     \
        for (int a = 1; a < n_edge; a++) {               /* insertion sort: a few values */   \
            int64_t v = edge[a];                                                              \
            int b = a - 1;                                                                    \
            while (b >= 0 && edge[b] > v) {                                                   \
                edge[b + 1] = edge[b];                                                        \
                b--;                                                                          \
            }                                                                                 \
            edge[b + 1] = v;                                                                  \
        }                                                                                     \
        const T *xr = x + i * ldx;                                                            \
        T *tr = target ? target + i * ldt : 0;                                                \
        for (int s = 0; s + 1 < n_edge; s++) {                                                \
            const int64_t j0 = edge[s], j1 = edge[s + 1];                                     \
            if (j1 <= j0 || (j0 == self && j1 == self + 1))                                   \
                continue;                                                                     \
            /* the segment's levels, grouped by factor (usually one group: f = 1) */          \
            int grp_of[MAX_LEVELS], n_grp = 0;                                                \
            T f_g[MAX_LEVELS], c_g[MAX_LEVELS];                                               \
            for (int64_t k = 0; k < levels; k++) {                                            \
                grp_of[k] = -1;                                                               \
                if (!(l0[k] <= j0 && j1 <= h0[k]))                                            \
                    continue;                                                                 \
                int g = 0;                                                                    \
                while (g < n_grp && f_g[g] != f_k[k])                                         \
                    g++;                                                                      \
                if (g == n_grp) {                                                             \
                    f_g[n_grp] = f_k[k];                                                      \
                    c_g[n_grp++] = 0;                                                         \
                }                                                                             \
                grp_of[k] = g;                                                                \
                if (tr)                                                                       \
                    c_g[g] += coef[k * ld_coef + i];                                          \
            }                                                                                 \
            if (n_grp == 0)                                                                   \
                continue;                                                                     \
            double st_g[MAX_LEVELS], sq_g[MAX_LEVELS];                                        \
            if (aliased && n_grp > 1)                                                         \
                PASS_GROUPS(xr, tr, j0, j1, n_grp, f_g, cut_t, eps_t, c_g, st_g, sq_g);       \
            else                                                                              \
                for (int g = 0; g < n_grp; g++)                                               \
                    PASS(xr, tr, j0, j1, f_g[g], cut_t, eps_t, c_g[g], st_g + g, sq_g + g);   \
            for (int64_t k = 0; k < levels; k++)                                              \
                if (grp_of[k] >= 0) {                                                         \
                    st_k[k] += st_g[grp_of[k]];                                               \
                    sq_k[k] += sq_g[grp_of[k]];                                               \
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

SEGMENT_PASS(pass_f32, float, log_f32)
SEGMENT_PASS(pass_f64, double, log)
SEGMENT_PASS_GROUPS(pass_groups_f32, float, log_f32)
SEGMENT_PASS_GROUPS(pass_groups_f64, double, log)
POSITIVES_KERNEL(hiertail_positives_f32, float, pass_f32, pass_groups_f32)
POSITIVES_KERNEL(hiertail_positives_f64, double, pass_f64, pass_groups_f64)
