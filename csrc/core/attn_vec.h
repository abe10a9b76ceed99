/* What the AVX2 and AVX-512 fp32 attention tiles share, written once over a vector width:
 *
 *   - the float32 exp and tanh polynomials (VT_EXP_REDUCE, VT_EXP_POLY, VT_TANH_POLY), as macros over
 *     the width's intrinsics: FMADD(a, b, c) = a * b + c, FNMADD(a, b, c) = c - a * b, MUL, ADD, SET1;
 *   - P V with the row's accumulator in registers (pv_vecs, pv_row), included after the includer
 *     defines T and AI (target and inlining), VEC (the vector type), VW (its float lanes), PV_MAXV (the
 *     most accumulator vectors the registers hold), VLOAD, VSTORE, VMUL, VFMA, VSET1 and VT_UNROLL.
 *
 * The operations and their order are the same on both widths, so the tiles round alike. */
#ifndef VTINFER_ATTN_VEC_H
#define VTINFER_ATTN_VEC_H

/* x - n ln 2 in two steps (ln 2 = 0.693359375 - 2.12194440e-4, the first exact in float32). */
#define VT_EXP_REDUCE(FNMADD, SET1, n, x) FNMADD(n, SET1(-2.12194440e-4f), FNMADD(n, SET1(0.693359375f), x))

/* e^r on |r| <= ln 2 / 2: 1 + r + r^2 P(r), Cephes expf's degree-5 P. */
#define VT_EXP_POLY(FMADD, MUL, ADD, SET1, r)                                                                        \
    FMADD(FMADD(FMADD(FMADD(FMADD(FMADD(SET1(1.9875691500E-4f), r, SET1(1.3981999507E-3f)), r,                       \
                                  SET1(8.3334519073E-3f)),                                                           \
                            r, SET1(4.1665795894E-2f)),                                                              \
                      r, SET1(1.6666665459E-1f)),                                                                    \
                r, SET1(5.0000001201E-1f)),                                                                          \
          MUL(r, r), ADD(r, SET1(1.0f)))

/* tanh(x) for |x| < 0.625: x + x z P(z), z = x^2, Cephes tanhf's degree-4 P. */
#define VT_TANH_POLY(FMADD, MUL, SET1, x, z)                                                                         \
    FMADD(MUL(FMADD(FMADD(FMADD(FMADD(SET1(-5.70498872745E-3f), z, SET1(2.06390887954E-2f)), z,                      \
                                SET1(-5.37397155531E-2f)),                                                           \
                          z, SET1(1.33314422036E-1f)),                                                               \
                    z, SET1(-3.33332819422E-1f)),                                                                    \
              z),                                                                                                    \
          x, x)

#endif

#ifdef VEC
/* acc[0 .. VW*NV) = acc * alpha + sum_jj P[jj] V_jj (NV a constant after inlining), the accumulator held in
 * registers. */
T static AI void pv_vecs(const int NV, float *acc, float alpha, const float *P, const float *vbuf, int Dp, int nk) {
    VEC a[PV_MAXV];
    const VEC al = VSET1(alpha);
    VT_UNROLL
    for (int v = 0; v < NV; v++) a[v] = VMUL(VLOAD(acc + VW * v), al);
    for (int jj = 0; jj < nk; jj++) {
        if (P[jj] == 0.0f) continue;
        const VEC pb = VSET1(P[jj]);
        const float *vr = vbuf + (size_t)jj * Dp;
        VT_UNROLL
        for (int v = 0; v < NV; v++) a[v] = VFMA(pb, VLOAD(vr + VW * v), a[v]);
    }
    VT_UNROLL
    for (int v = 0; v < NV; v++) VSTORE(acc + VW * v, a[v]);
}

/* One row's P V from the decoded V rows in vbuf (Dp a multiple of 2 VW). */
T static void pv_row(float *acc, float alpha, const float *P, const float *vbuf, int Dp, int nk) {
    int d = 0;
    for (; Dp - d >= PV_MAXV * VW; d += PV_MAXV * VW) pv_vecs(PV_MAXV, acc + d, alpha, P, vbuf + d, Dp, nk);
    if (PV_MAXV > 8 && Dp - d >= 8 * VW) pv_vecs(8, acc + d, alpha, P, vbuf + d, Dp, nk), d += 8 * VW;
    if (Dp - d >= 4 * VW) pv_vecs(4, acc + d, alpha, P, vbuf + d, Dp, nk), d += 4 * VW;
    if (Dp - d >= 2 * VW) pv_vecs(2, acc + d, alpha, P, vbuf + d, Dp, nk);
}
#endif
