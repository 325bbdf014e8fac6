/* Branch-free float exp and log shared by the engine's C kernels: they vectorise inside
 * `omp simd` loops, where a libm call would not. Accuracy tested against float64
 * (hiertail_exp_f32 / hiertail_log_f32, exported by _block_exp.c / _positive_blocks.c). */
#ifndef HIERTAIL_NATIVE_MATH_H
#define HIERTAIL_NATIVE_MATH_H
#include <stdint.h>

/* exp(x) for x in [-87, 0]: x = n ln2 + r, |r| <= ln2 / 2 (n rounded with the 1.5 * 2^23
 * trick, ln2 in two parts so n ln2 is exact enough), exp(r) by Cephes' degree-6 polynomial,
 * 2^n from the exponent bits. */
static inline float exp_f32(float x)
{
    const float shifter = 12582912.0f;               /* 1.5 * 2^23: adding it rounds to int */
    float n = (x * 1.44269504088896341f + shifter) - shifter;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    union { float f; int32_t i; } u = { y };
    u.i += (int32_t)n * (1 << 23);                   /* y * 2^n (n >= -126: no denormal) */
    return u.f;
}

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

#endif
