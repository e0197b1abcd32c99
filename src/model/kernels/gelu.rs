//! GELU's tanh approximation times the MLP's up projection, `gelu(g)·u`, with `tanh` computed
//! as glibc's `tanhf` computes it (the fdlibm algorithm of glibc 2.36: `expm1f` of `2|x|`,
//! then `1 − 2/(t + 2)` or `−t/(t + 2)`), operation for operation, in sixteen AVX-512 lanes.
//!
//! Why: Gemma's MLP calls `tanh` once per intermediate value (2048 per token per layer); the
//! scalar libm call and its `expm1f` were 12% of a Gemma 3 270M profile. Every step of the
//! fdlibm algorithm is a single IEEE operation (no fused multiply-adds: glibc's generic
//! x86-64 build has none) or an integer operation on the bits, and its branches depend only on
//! the argument, so evaluating every branch in each lane and keeping the one the scalar code
//! takes gives the same bits as the scalar code. [`tanhf`] is that scalar code, the
//! definition every path reproduces; it equals glibc 2.36's `tanhf` for every f32 (checked
//! against the system's libm over all 2³² inputs by an ignored test, and on a sample of them
//! in the quick suite). So the values are the ones candle's `gelu` (which calls the libm
//! `tanh`) gave before, and a result no longer depends on which libm a machine has.
//!
//! Levels: AVX-512 runs sixteen lanes; AVX2 and portable run [`tanhf`] per element (the
//! same bits).

use rayon::prelude::*;

use super::Isa;

const ONE: f32 = 1.0;
const LN2_HI: f32 = f32::from_bits(0x3f31_7180);
const LN2_LO: f32 = f32::from_bits(0x3717_f7d1);
const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
const O_THRESHOLD: f32 = f32::from_bits(0x42b1_7180);
/// The scaled coefficients of fdlibm's `expm1f` rational approximation.
const Q: [f32; 5] = [
    f32::from_bits(0xbd08_8889),
    f32::from_bits(0x3ad0_0d01),
    f32::from_bits(0xb8a6_70cd),
    f32::from_bits(0x3686_7e54),
    f32::from_bits(0xb457_edbb),
];
/// `√(2/π)` as candle's (and PyTorch's) GELU writes it.
const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044715;

/// `e^x − 1` as fdlibm's `expm1f` (glibc 2.36) computes it, branch for branch.
pub fn expm1f(x: f32) -> f32 {
    let negative = x.to_bits() >> 31 != 0;
    let hx = x.to_bits() & 0x7fff_ffff;
    if hx >= 0x4195_b844 {
        // |x| ≥ 27·ln 2
        if hx >= 0x42b1_7218 {
            if hx > 0x7f80_0000 {
                return x + x;
            }
            if hx == 0x7f80_0000 {
                return if negative { -1.0 } else { x };
            }
            if x > O_THRESHOLD {
                return f32::INFINITY;
            }
        }
        if negative {
            return -1.0;
        }
    }
    let (xr, c, k) = if hx > 0x3eb1_7218 {
        // |x| > ln 2 / 2: reduce by k·ln 2 in two parts.
        let (hi, lo, k) = if hx < 0x3f85_1592 {
            if negative {
                (x + LN2_HI, -LN2_LO, -1)
            } else {
                (x - LN2_HI, LN2_LO, 1)
            }
        } else {
            let k = (INV_LN2 * x + if negative { -0.5 } else { 0.5 }) as i32;
            let t = k as f32;
            (x - t * LN2_HI, t * LN2_LO, k)
        };
        let xr = hi - lo;
        (xr, (hi - xr) - lo, k)
    } else if hx < 0x3300_0000 {
        return x;
    } else {
        (x, 0.0, 0)
    };
    let hfx = 0.5 * xr;
    let hxs = xr * hfx;
    let r1 = ONE + hxs * (Q[0] + hxs * (Q[1] + hxs * (Q[2] + hxs * (Q[3] + hxs * Q[4]))));
    let t = 3.0 - r1 * hfx;
    let e = hxs * ((r1 - t) / (6.0 - xr * t));
    if k == 0 {
        return xr - (xr * e - hxs);
    }
    let e = (xr * (e - c) - c) - hxs;
    let scaled = |y: f32| f32::from_bits((y.to_bits() as i32).wrapping_add(k << 23) as u32);
    match k {
        -1 => 0.5 * (xr - e) - 0.5,
        1 if xr < -0.25 => -2.0 * (e - (xr + 0.5)),
        1 => ONE + 2.0 * (xr - e),
        k if k <= -2 || k > 56 => scaled(ONE - (e - xr)) - ONE,
        k if k < 23 => scaled(f32::from_bits(0x3f80_0000 - (0x0100_0000 >> k)) - (e - xr)),
        k => scaled(xr - (e + f32::from_bits(((0x7f - k) << 23) as u32)) + ONE),
    }
}

/// `tanh(x)` as fdlibm's `tanhf` (glibc 2.36) computes it: the definition of this module.
pub fn tanhf(x: f32) -> f32 {
    let jx = x.to_bits() as i32;
    let ix = jx & 0x7fff_ffff;
    if ix >= 0x7f80_0000 {
        return if jx >= 0 {
            ONE / x + ONE
        } else {
            ONE / x - ONE
        };
    }
    let z = if ix < 0x41b0_0000 {
        if ix == 0 {
            return x;
        }
        if ix < 0x2400_0000 {
            return x * (ONE + x);
        }
        if ix >= 0x3f80_0000 {
            let t = expm1f(2.0 * x.abs());
            ONE - 2.0 / (t + 2.0)
        } else {
            let t = expm1f(-2.0 * x.abs());
            -t / (t + 2.0)
        }
    } else {
        ONE - 1.0e-30
    };
    if jx >= 0 {
        z
    } else {
        -z
    }
}

/// One element: candle's `gelu` (tanh form) times `u`, in its order of operations.
fn gelu_mul_one(v: f32, u: f32) -> f32 {
    let gelu = 0.5 * v * (ONE + tanhf(SQRT_TWO_OVER_PI * v * (ONE + GELU_CUBIC * v * v)));
    gelu * u
}

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// `gelu(g)·u` elementwise on the caller's thread pool, at level `isa` (lowered to what this
/// process may use; every level gives the same bits).
pub fn gelu_mul_with(isa: Isa, gate: &[f32], up: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), up.len(), "gate/up shapes");
    let isa = isa.min(super::isa());
    let mut h = vec![0f32; gate.len()];
    h.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|(h, (gate, up))| {
            #[cfg(target_arch = "x86_64")]
            if isa >= Isa::Avx512 {
                // SAFETY: AVX-512F was detected and seen to execute; equal lengths.
                return unsafe { avx512::gelu_mul(gate, up, h) };
            }
            for ((h, &g), &u) in h.iter_mut().zip(gate).zip(up) {
                *h = gelu_mul_one(g, u);
            }
        });
    h
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{GELU_CUBIC, INV_LN2, LN2_HI, LN2_LO, ONE, Q, SQRT_TWO_OVER_PI};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn int(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }

    /// `y` with `k` added to its exponent bits (fdlibm's `SET_FLOAT_WORD(y, i + (k << 23))`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn scaled(y: __m512, k: __m512i) -> __m512 {
        _mm512_castsi512_ps(_mm512_add_epi32(
            _mm512_castps_si512(y),
            _mm512_slli_epi32::<23>(k),
        ))
    }

    /// [`super::expm1f`] of `u` for `|u|` < 27·ln 2 or `u` positive and finite below the
    /// overflow threshold (what `tanhf` passes it), every branch evaluated and the scalar
    /// code's one kept per lane.
    #[target_feature(enable = "avx512f")]
    unsafe fn expm1(u: __m512) -> __m512 {
        let bits = _mm512_castps_si512(u);
        let hx = _mm512_and_si512(bits, int(0x7fff_ffff));
        let negative = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
        let tiny = _mm512_cmplt_epi32_mask(hx, int(0x3300_0000));
        let unreduced = _mm512_cmple_epi32_mask(hx, int(0x3eb1_7218));
        let near = _mm512_cmplt_epi32_mask(hx, int(0x3f85_1592)) & !unreduced;
        // k: 0, ±1 near ±ln 2, else trunc(u/ln 2 ± 1/2).
        let half = _mm512_mask_blend_ps(negative, splat(0.5), splat(-0.5));
        let far_k = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(splat(INV_LN2), u), half));
        let unit = _mm512_mask_blend_epi32(negative, int(1), int(-1));
        let k = _mm512_mask_blend_epi32(near, far_k, unit);
        let k = _mm512_mask_blend_epi32(unreduced, k, _mm512_setzero_si512());
        // With t = k the reduction is the scalar code's in every branch: t = ±1 gives
        // x ∓ ln2_hi and ±ln2_lo exactly, t = 0 leaves x as it is (and c = 0).
        let t = _mm512_cvtepi32_ps(k);
        let hi = _mm512_sub_ps(u, _mm512_mul_ps(t, splat(LN2_HI)));
        let lo = _mm512_mul_ps(t, splat(LN2_LO));
        let xr = _mm512_sub_ps(hi, lo);
        let c = _mm512_sub_ps(_mm512_sub_ps(hi, xr), lo);
        let hfx = _mm512_mul_ps(splat(0.5), xr);
        let hxs = _mm512_mul_ps(xr, hfx);
        let mut p = _mm512_mul_ps(hxs, splat(Q[4]));
        for q in [Q[3], Q[2], Q[1], Q[0]] {
            p = _mm512_mul_ps(hxs, _mm512_add_ps(splat(q), p));
        }
        let r1 = _mm512_add_ps(splat(ONE), p);
        let tt = _mm512_sub_ps(splat(3.0), _mm512_mul_ps(r1, hfx));
        let e = _mm512_mul_ps(
            hxs,
            _mm512_div_ps(
                _mm512_sub_ps(r1, tt),
                _mm512_sub_ps(splat(6.0), _mm512_mul_ps(xr, tt)),
            ),
        );
        let k0 = _mm512_sub_ps(xr, _mm512_sub_ps(_mm512_mul_ps(xr, e), hxs));
        let e = _mm512_sub_ps(
            _mm512_sub_ps(_mm512_mul_ps(xr, _mm512_sub_ps(e, c)), c),
            hxs,
        );
        let km1 = _mm512_sub_ps(_mm512_mul_ps(splat(0.5), _mm512_sub_ps(xr, e)), splat(0.5));
        let kp1 = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(xr, splat(-0.25)),
            _mm512_add_ps(splat(ONE), _mm512_mul_ps(splat(2.0), _mm512_sub_ps(xr, e))),
            _mm512_mul_ps(splat(-2.0), _mm512_sub_ps(e, _mm512_add_ps(xr, splat(0.5)))),
        );
        let e_minus_x = _mm512_sub_ps(e, xr);
        let far = _mm512_sub_ps(scaled(_mm512_sub_ps(splat(ONE), e_minus_x), k), splat(ONE));
        // 2 ≤ k < 23: t = 1 − 2^−k; 23 ≤ k ≤ 56: t = 2^−k.
        let one_minus = _mm512_castsi512_ps(_mm512_sub_epi32(
            int(0x3f80_0000),
            _mm512_srav_epi32(int(0x0100_0000), k),
        ));
        let small_k = scaled(_mm512_sub_ps(one_minus, e_minus_x), k);
        let pow = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_sub_epi32(int(0x7f), k)));
        let mid_k = scaled(
            _mm512_add_ps(_mm512_sub_ps(xr, _mm512_add_ps(e, pow)), splat(ONE)),
            k,
        );
        let is = |v: i32| _mm512_cmpeq_epi32_mask(k, int(v));
        let far_mask = _mm512_cmple_epi32_mask(k, int(-2)) | _mm512_cmpgt_epi32_mask(k, int(56));
        let mut r = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(k, int(23)), mid_k, small_k);
        r = _mm512_mask_blend_ps(far_mask, r, far);
        r = _mm512_mask_blend_ps(is(1), r, kp1);
        r = _mm512_mask_blend_ps(is(-1), r, km1);
        r = _mm512_mask_blend_ps(is(0), r, k0);
        _mm512_mask_blend_ps(tiny, r, u)
    }

    /// [`super::tanhf`] in sixteen lanes.
    #[target_feature(enable = "avx512f")]
    unsafe fn tanh(x: __m512) -> __m512 {
        let bits = _mm512_castps_si512(x);
        let ix = _mm512_and_si512(bits, int(0x7fff_ffff));
        let sign = _mm512_and_si512(bits, int(i32::MIN));
        let ax = _mm512_castsi512_ps(ix);
        let at_least_one = _mm512_cmpge_epi32_mask(ix, int(0x3f80_0000));
        let two_ax = _mm512_add_ps(ax, ax);
        let minus_two_ax =
            _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(two_ax), int(i32::MIN)));
        let t = expm1(_mm512_mask_blend_ps(at_least_one, minus_two_ax, two_ax));
        let t_plus_two = _mm512_add_ps(t, splat(2.0));
        let z_large = _mm512_sub_ps(splat(ONE), _mm512_div_ps(splat(2.0), t_plus_two));
        let minus_t = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), int(i32::MIN)));
        let z_small = _mm512_div_ps(minus_t, t_plus_two);
        let z = _mm512_mask_blend_ps(at_least_one, z_small, z_large);
        // |x| ≥ 22 and ±∞: ±1; NaN: itself, quieted (as 1/x ± 1 gives it).
        let saturated = _mm512_cmpge_epi32_mask(ix, int(0x41b0_0000));
        let z = _mm512_mask_blend_ps(saturated, z, splat(ONE));
        let signed = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(z), sign));
        // |x| < 2^−55 (zero included): x·(1 + x).
        let tiny = _mm512_cmplt_epi32_mask(ix, int(0x2400_0000));
        let r = _mm512_mask_blend_ps(tiny, signed, _mm512_mul_ps(x, _mm512_add_ps(splat(ONE), x)));
        let nan = _mm512_cmpgt_epi32_mask(ix, int(0x7f80_0000));
        _mm512_mask_blend_ps(nan, r, _mm512_add_ps(x, x))
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu_mul(gate: &[f32], up: &[f32], h: &mut [f32]) {
        assert!(gate.len() == up.len() && h.len() == gate.len());
        let n16 = gate.len() / 16 * 16;
        for i in (0..n16).step_by(16) {
            let v = _mm512_loadu_ps(gate.as_ptr().add(i));
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let cubic = _mm512_mul_ps(_mm512_mul_ps(splat(GELU_CUBIC), v), v);
            let arg = _mm512_mul_ps(
                _mm512_mul_ps(splat(SQRT_TWO_OVER_PI), v),
                _mm512_add_ps(splat(ONE), cubic),
            );
            let gelu = _mm512_mul_ps(
                _mm512_mul_ps(splat(0.5), v),
                _mm512_add_ps(splat(ONE), tanh(arg)),
            );
            _mm512_storeu_ps(h.as_mut_ptr().add(i), _mm512_mul_ps(gelu, u));
        }
        for i in n16..gate.len() {
            h[i] = super::gelu_mul_one(gate[i], up[i]);
        }
    }

    /// [`tanh`] over a slice (for the tests).
    #[cfg(test)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tanh_slice(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(16);
        for c in &mut chunks {
            _mm512_storeu_ps(c.as_mut_ptr(), tanh(_mm512_loadu_ps(c.as_ptr())));
        }
        for x in chunks.into_remainder() {
            *x = super::tanhf(*x);
        }
    }
}

#[cfg(test)]
#[path = "gelu_tests.rs"]
mod tests;
