/* Shared by the engine's C kernels. Threads: a kernel built with -fopenmp by
 * ``_native.load(..., openmp=True)`` runs its row loop on torch's own OpenMP threads (no runtime
 * of its own is linked; see ``_native.py``); the serial build ignores the pragmas. Rows are
 * independent, so the result is the same bit for bit on any thread count. NUM_THREADS /
 * THREAD_NUM let a kernel report how many threads ran. */
#ifndef HIERTAIL_NATIVE_OMP_H
#define HIERTAIL_NATIVE_OMP_H
#ifdef _OPENMP
int omp_get_num_threads(void);
int omp_get_thread_num(void);
#define NUM_THREADS() omp_get_num_threads()
#define THREAD_NUM() omp_get_thread_num()
#else
#define NUM_THREADS() 1
#define THREAD_NUM() 0
#endif
#endif
