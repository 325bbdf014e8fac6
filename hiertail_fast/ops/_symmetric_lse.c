/* The two element-wise passes of the symmetric CPU engine (the scheme and its math: the
 * docstring of ``_lse_symmetric.py``; DESIGN.md section 3 for the loss).
 *
 * s_ij = s_ji: the engine visits each unordered pair once, in a tile of logits s [rows, cols]
 * of the upper triangle (rows i of a row block, columns j of the keys after it; a "diagonal"
 * tile is the block against itself and is read row-wise only). Every entry serves its row i
 * (key j, weight w_j) and, off the diagonal, its column j (as a row, key i, weight w_i).
 * The tile holds the dot products z_i . z_j; each pass scales them in place first (s = scale x,
 * the reference's rounding of (z_i . z_j) / tau, and the same in both passes).
 *
 * Pass 1 (hiertail_sym_stats_f32), running statistics of every row over all keys seen so far:
 *     M_i = max_k s_ik (+ arg-max: the smallest original id among ties, torch.max's rule in
 *     the caller's order), S_i = sum_k w_k exp(s_ik - M_i) (float64).
 * Pass 2 (hiertail_sym_grad_f32), the tile overwritten by the gradient weights
 *     W_ij = g_i w_j exp(s_ij - lse_i) + g_j w_i exp(s_ij - lse_j)    (diagonal: first term)
 * (the caller then adds W z_cols to dz_rows and W^T z_rows to dz_cols), plus, for the official
 * variant, its positive pairs (rows sorted by label: row i's positives are the columns
 * [lo_i, hi_i)): x = exp(s_ij - M_i), T_i += log(x + eps), Q_i += q = x / (x + eps),
 * W_ij += c_i q; and the same for the column (x from M_j, c_j) off the diagonal.
 *
 * Exponent arguments are split as (s - M) + (small part) so the large logits cancel exactly
 * (s and M are fp32 values of the same products); terms below e^-C of their row's largest
 * are exactly 0, so no denormal reaches the caller's GEMMs.
 *
 * Tiles are processed in chunks of CHUNK columns (a [rows, CHUNK] slice, <= 256 KB, stays in
 * L2 between the sweeps); the chunks are split over torch's OpenMP threads (``_native.py``):
 * a column belongs to one chunk, the rows' sums are kept per thread and merged at the end.
 * Compiled on first use by ``_native.py`` (plain C99, no Python or torch headers).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "_native_math.h"
#include "_native_omp.h"

#define CHUNK 256
/* below this many entries a tile runs on one thread (a fork costs a few us) */
#define PARALLEL_MIN_ENTRIES 32768

static inline float cut_exp(float a, float cutoff, float thr)
{
    a = a < -cutoff ? -cutoff : a;
    const float v = exp_f32(a);
    return v <= thr ? 0.0f : v;
}

/* Merge (m, s, a) into the running (*rm, *rs, *ra): larger max wins, on a tie the smaller id. */
static inline void merge_stats(float m, double s, int64_t a, float *rm, double *rs, int64_t *ra)
{
    if (a < 0)
        return;                                    /* nothing seen */
    if (m > *rm || *ra < 0) {
        *rs = (*ra < 0 ? 0.0 : *rs * exp((double)*rm - (double)m)) + s;
        *rm = m;
        *ra = a;
    } else {
        *rs += s * exp((double)m - (double)*rm);
        if (m == *rm && a < *ra)
            *ra = a;
    }
}

static int threads_for(int64_t threads, int64_t rows, int64_t cols)
{
    if (threads < 1 || rows * cols < PARALLEL_MIN_ENTRIES || cols <= CHUNK)
        return 1;
    const int64_t chunks = (cols + CHUNK - 1) / CHUNK;
    return (int)(threads < chunks ? threads : chunks);
}

/* Pass 1 over one tile. Running stats: row_* [rows] (this block's rows), col_* [cols] (the
 * columns' own rows; not touched on the diagonal). ids: original ids (arg-max tie rule). An
 * arg-max of -1 means "nothing seen yet". Returns the number of threads that ran. */
int64_t hiertail_sym_stats_f32(int64_t threads, int64_t rows, int64_t cols, float *s,
                               int64_t lds, int64_t diag, float scale, const float *w_row,
                               const float *w_col,
                               const int64_t *id_row, const int64_t *id_col, float cutoff,
                               float thr, float *row_m, double *row_s, int64_t *row_a,
                               float *col_m, double *col_s, int64_t *col_a)
{
    const int nt = threads_for(threads, rows, cols);
    /* per-thread running stats of the rows */
    float *pm = malloc(sizeof(float) * rows * nt);
    double *ps = malloc(sizeof(double) * rows * nt);
    int64_t *pa = malloc(sizeof(int64_t) * rows * nt);
    float *cm_chunk = malloc(sizeof(float) * rows * nt);
    int64_t used = 1;
    if (!pm || !ps || !pa || !cm_chunk) {
        free(pm); free(ps); free(pa); free(cm_chunk);
        return -1;
    }
    const int64_t n_chunks = (cols + CHUNK - 1) / CHUNK;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int t = THREAD_NUM();
        if (t == 0)
            used = NUM_THREADS();
        float *tm = pm + t * rows, *chunk_max = cm_chunk + t * rows;
        double *ts = ps + t * rows;
        int64_t *ta = pa + t * rows;
        for (int64_t i = 0; i < rows; i++) {
            tm[i] = -INFINITY;
            ts[i] = 0.0;
            ta[i] = -1;
        }
        float old_m[CHUNK], ccm[CHUNK];
        float cacc[CHUNK];   /* <= rows (256) terms per tile, then float64 */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < n_chunks; c++) {
            const int64_t k0 = c * CHUNK, n = (k0 + CHUNK < cols ? CHUNK : cols - k0);
            float *cm = col_m + k0;
            int64_t *ca = col_a + k0;
            /* sweep 1: the logits scaled in place (the dot first, then the scale: the
             * reference's rounding of (z_i . z_k) / tau), the chunk's row maxima and column
             * maxima (maxima only: vectorised) */
            if (!diag)
                for (int64_t k = 0; k < n; k++) {
                    old_m[k] = ca[k] < 0 ? -INFINITY : cm[k];
                    ccm[k] = -INFINITY;
                }
            for (int64_t i = 0; i < rows; i++) {
                float *x = s + i * lds + k0;
                float m = -INFINITY;
                if (diag) {
#pragma omp simd reduction(max:m)
                    for (int64_t k = 0; k < n; k++) {
                        const float v = x[k] * scale;
                        x[k] = v;
                        m = v > m ? v : m;
                    }
                } else {
#pragma omp simd reduction(max:m)
                    for (int64_t k = 0; k < n; k++) {
                        const float v = x[k] * scale;
                        x[k] = v;
                        ccm[k] = v > ccm[k] ? v : ccm[k];
                        m = v > m ? v : m;
                    }
                }
                chunk_max[i] = m;
            }
            /* the columns' running maxima; their arg-max only where the chunk holds the max
             * (a new max, or a tie that may come with a smaller id): a strided scan of that
             * column of the chunk (in L2), rare after the first row blocks */
            if (!diag)
                for (int64_t k = 0; k < n; k++) {
                    const float c = ccm[k];
                    const int seen = ca[k] >= 0;
                    if (seen && c < old_m[k])
                        continue;
                    if (!id_row) {                 /* untracked: id 0 marks "seen" */
                        cm[k] = seen && old_m[k] > c ? old_m[k] : c;
                        ca[k] = 0;
                        continue;
                    }
                    int64_t a = -1;
                    for (int64_t i = 0; i < rows; i++)
                        if (s[i * lds + k0 + k] == c && (a < 0 || id_row[i] < a))
                            a = id_row[i];
                    if (a < 0)
                        continue;                  /* a NaN column: the caller's checks */
                    if (!seen || c > old_m[k]) {
                        cm[k] = c;
                        ca[k] = a;
                    } else if (a < ca[k]) {
                        ca[k] = a;
                    }
                }
            /* the rows' running maxima (arg-max: the smallest id holding the chunk's max) */
            for (int64_t i = 0; i < rows; i++) {
                const float m = chunk_max[i];
                if (ta[i] >= 0 && m < tm[i])
                    continue;
                const float *x = s + i * lds + k0;
                int64_t a = -1;
                if (!id_col)
                    a = m == m ? 0 : -1;           /* untracked: any id marks "seen" */
                else
                    for (int64_t k = 0; k < n; k++)
                        if (x[k] == m && (a < 0 || id_col[k0 + k] < a))
                            a = id_col[k0 + k];
                if (a < 0)
                    continue;                      /* a NaN row: left to the caller's checks */
                if (ta[i] < 0 || m > tm[i]) {
                    ts[i] = ta[i] < 0 ? 0.0 : ts[i] * exp((double)tm[i] - (double)m);
                    tm[i] = m;
                    ta[i] = a;
                } else if (a < ta[i]) {
                    ta[i] = a;
                }
            }
            /* the columns' sums, rescaled where their max grew */
            if (!diag)
                for (int64_t k = 0; k < n; k++) {
                    if (cm[k] > old_m[k] && old_m[k] > -INFINITY)
                        col_s[k0 + k] *= exp((double)old_m[k] - (double)cm[k]);
                    else if (old_m[k] == -INFINITY)
                        col_s[k0 + k] = 0.0;
                    cacc[k] = 0.0f;
                }
            /* sweep 2: the exps, shifted by the running maxima */
            const float *wc = w_col + k0;
            for (int64_t i = 0; i < rows; i++) {
                const float *x = s + i * lds + k0;
                const float sh = tm[i];
                double racc = 0.0;
                if (diag) {
#pragma omp simd reduction(+:racc)
                    for (int64_t k = 0; k < n; k++)
                        racc += (double)(wc[k] * cut_exp(x[k] - sh, cutoff, thr));
                } else {
                    const float wi = w_row[i];
#pragma omp simd reduction(+:racc)
                    for (int64_t k = 0; k < n; k++) {
                        const float v = x[k];
                        racc += (double)(wc[k] * cut_exp(v - sh, cutoff, thr));
                        cacc[k] += wi * cut_exp(v - cm[k], cutoff, thr);
                    }
                }
                ts[i] += racc;
            }
            if (!diag)
                for (int64_t k = 0; k < n; k++)
                    col_s[k0 + k] += (double)cacc[k];
        }
    }
    /* the row stats of the threads that ran, in order: OpenMP may start fewer than nt
     * (OMP_THREAD_LIMIT, OMP_DYNAMIC), whose slots nobody initialised (read, they gave NaN
     * losses and garbage arg-max indices) */
    for (int t = 0; t < used; t++)
        for (int64_t i = 0; i < rows; i++)
            merge_stats(pm[t * rows + i], ps[t * rows + i], pa[t * rows + i], row_m + i,
                        row_s + i, row_a + i);
    free(pm); free(ps); free(pa); free(cm_chunk);
    return used;
}

/* The row's entries [k0, k1) of one chunk: W in place. With positives: x = exp(s - M) of the
 * row (and of the column, off the diagonal), sums into *t_row / *q_row and t_col / q_col, and
 * c q into W; ``self_k``: a column to skip among the positives (-1: none). There the LSE terms
 * reuse x: g_i w_j exp(s - lse_i) = x * (g_i e^-rel_i) * w_j (f_c[j] = g_j e^-rel_j), one exp
 * per direction instead of two (the positive entries are ~1/6 of all on Zipf labels). */
static inline void grad_span(float *x, int64_t k0, int64_t k1, int diag, float m_i, float b_i,
                             float g_i, float lw_i, const float *lw_c, const float *m_c,
                             const float *rel_c, const float *g_c, float w_i, const float *w_c,
                             const float *f_c, float cutoff, float thr,
                             int pos, float c_i, const float *c_c, float eps, int64_t self_k,
                             double *t_row, double *q_row, double *t_col, double *q_col)
{
    double tr = 0.0, qr = 0.0;
    if (!pos && diag) {
#pragma omp simd
        for (int64_t k = k0; k < k1; k++)
            x[k] = g_i * cut_exp((x[k] - m_i) + (lw_c[k] - b_i), cutoff, thr);
    } else if (!pos) {
#pragma omp simd
        for (int64_t k = k0; k < k1; k++) {
            const float v = x[k];
            x[k] = g_i * cut_exp((v - m_i) + (lw_c[k] - b_i), cutoff, thr)
                 + g_c[k] * cut_exp((v - m_c[k]) + (lw_i - rel_c[k]), cutoff, thr);
        }
    } else if (diag) {   /* positives: p = exp(s - M) serves both terms, p_ij = p w_j e^-rel_i */
        const float f_i = g_i * expf(-b_i);
#pragma omp simd reduction(+:tr, qr)
        for (int64_t k = k0; k < k1; k++) {
            const float keep = k == self_k ? 0.0f : 1.0f;
            const float p = cut_exp(x[k] - m_i, cutoff, thr), d = p + eps, q = p / d;
            tr += (double)(keep * log_f32(d));
            qr += (double)(keep * q);
            x[k] = p * (f_i * w_c[k]) + keep * c_i * q;
        }
    } else {
        const float f_i = g_i * expf(-b_i);
#pragma omp simd reduction(+:tr, qr)
        for (int64_t k = k0; k < k1; k++) {
            const float v = x[k];
            const float p = cut_exp(v - m_i, cutoff, thr), d = p + eps, q = p / d;
            const float pc = cut_exp(v - m_c[k], cutoff, thr), dc = pc + eps, qc = pc / dc;
            tr += (double)log_f32(d);
            qr += (double)q;
            t_col[k] += (double)log_f32(dc);
            q_col[k] += (double)qc;
            x[k] = p * (f_i * w_c[k]) + pc * (f_c[k] * w_i) + c_i * q + c_c[k] * qc;
        }
    }
    *t_row += tr;
    *q_row += qr;
}

/* Pass 2 over one tile, s overwritten by W. Per row (r_*) and column (c_*): M (fp32 row max),
 * rel = lse - M, g (the LSE's gradient coefficient), lw = log w. Positives (official; lo == NULL:
 * none): row i's positive keys [lo_i, hi_i) in the caller's key numbering, col0 the key of
 * the tile's column 0; coefficients c_*, key weights w_*, c_f = g e^-rel of the columns, sums
 * into t_* / q_* (float64); include_self = 0 skips the row's own column on the diagonal.
 * Returns the number of threads that ran (-1: out of memory). */
int64_t hiertail_sym_grad_f32(int64_t threads, int64_t rows, int64_t cols, float *s, int64_t lds,
                              int64_t diag, float scale, const float *r_m, const float *r_rel,
                              const float *r_g, const float *r_lw, const float *c_m,
                              const float *c_rel, const float *c_g, const float *c_lw,
                              float cutoff, float thr, const int64_t *lo, const int64_t *hi,
                              int64_t col0, int64_t include_self, const float *r_c, const float *c_c,
                              const float *r_w, const float *c_w, const float *c_f,
                              float eps, double *t_row, double *q_row, double *t_col,
                              double *q_col)
{
    const int nt = threads_for(threads, rows, cols);
    double *pt = NULL, *pq = NULL;
    int64_t used = 1;
    if (lo) {
        pt = calloc((size_t)(rows * nt), sizeof(double));
        pq = calloc((size_t)(rows * nt), sizeof(double));
        if (!pt || !pq) {
            free(pt); free(pq);
            return -1;
        }
    }
    const int64_t n_chunks = (cols + CHUNK - 1) / CHUNK;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int t = THREAD_NUM();
        if (t == 0)
            used = NUM_THREADS();
        double dummy_t = 0.0, dummy_q = 0.0;
#pragma omp for schedule(static)
        for (int64_t c = 0; c < n_chunks; c++) {
            const int64_t k0 = c * CHUNK, k1 = (k0 + CHUNK < cols ? k0 + CHUNK : cols);
            for (int64_t i = 0; i < rows; i++) {
                float *x = s + i * lds;
#pragma omp simd
                for (int64_t k = k0; k < k1; k++)      /* the logits, as pass 1 scaled them */
                    x[k] *= scale;
                const float m_i = r_m[i], b_i = r_rel[i], g_i = r_g[i], lw_i = r_lw[i];
                int64_t p0 = k0, p1 = k0;          /* the positives inside this chunk */
                if (lo) {                          /* the row's range, tile columns */
                    const int64_t a = lo[i] - col0, b = hi[i] - col0;
                    p0 = a < k0 ? k0 : (a > k1 ? k1 : a);
                    p1 = b > k1 ? k1 : (b < p0 ? p0 : b);
                }
                double *tr = lo ? pt + t * rows + i : &dummy_t;
                double *qr = lo ? pq + t * rows + i : &dummy_q;
                const int64_t self_k = (diag && !include_self) ? i : -1;
                const float w_i = lo ? r_w[i] : 0.0f;
                grad_span(x, k0, p0, (int)diag, m_i, b_i, g_i, lw_i, c_lw, c_m, c_rel, c_g,
                          w_i, c_w, c_f, cutoff, thr, 0, 0.0f, c_c, eps, -1, tr, qr, t_col,
                          q_col);
                if (p1 > p0)
                    grad_span(x, p0, p1, (int)diag, m_i, b_i, g_i, lw_i, c_lw, c_m, c_rel,
                              c_g, w_i, c_w, c_f, cutoff, thr, 1, r_c[i], c_c, eps, self_k, tr,
                              qr, t_col, q_col);
                grad_span(x, p1, k1, (int)diag, m_i, b_i, g_i, lw_i, c_lw, c_m, c_rel, c_g,
                          w_i, c_w, c_f, cutoff, thr, 0, 0.0f, c_c, eps, -1, tr, qr, t_col,
                          q_col);
            }
        }
    }
    if (lo) {
        for (int t = 0; t < nt; t++)
            for (int64_t i = 0; i < rows; i++) {
                t_row[i] += pt[t * rows + i];
                q_row[i] += pq[t * rows + i];
            }
        free(pt); free(pq);
    }
    return used;
}
