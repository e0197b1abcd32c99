//! Elementwise functions in f32 with AVX-512, AVX2 and portable paths that give the same
//! bits: the exponential (for softmax) and SiLU gating.
//!
//! Why our own: glibc's scalar `expf` was 5–7% of an evaluation (attention softmax and the
//! MLP's SiLU, 94M exponentials per 512-token SmolLM2 window), and a polynomial whose every
//! step is an IEEE operation (fma, mul, add, round-to-even) gives identical results with and
//! without SIMD, so a result never depends on the machine's vector width.

use rayon::prelude::*;

/// `e^x` for every element, the same bits at every instruction-set level. See [`exp`].
pub fn exp_in_place(xs: &mut [f32]) {
    exp_in_place_with(super::isa(), xs)
}

/// [`exp_in_place`] at level `isa`, lowered to what this process may use.
pub(crate) fn exp_in_place_with(isa: super::Isa, xs: &mut [f32]) {
    exp_shifted_in_place_with(isa, xs, 0.0)
}

/// `e^(x − shift)` for every element, `x − shift` rounded to f32 first: the bits of
/// subtracting in place and then [`exp_in_place`] (a softmax's shift by the row's maximum),
/// in one pass. A shift of zero changes no input (`x − 0 = x`, −0 included).
pub(crate) fn exp_shifted_in_place_with(isa: super::Isa, xs: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        match isa.min(super::isa()) {
            // SAFETY: AVX-512F was detected and seen to execute.
            super::Isa::Avx512 | super::Isa::Avx512Bf16 | super::Isa::Amx => {
                return unsafe { avx512::exp_in_place(xs, shift) }
            }
            // SAFETY: AVX2 and FMA were detected and seen to execute.
            super::Isa::Avx2 => return unsafe { avx2::exp_in_place(xs, shift) },
            super::Isa::Portable => {}
        }
    }
    let _ = isa;
    for x in xs {
        *x = exp(*x - shift);
    }
}

// Cephes' expf: e^x = 2^n·e^r, n = round(x·log2 e), r = x − n·ln 2 (in two parts), e^r by a
// degree-7 polynomial; within 2 ulp of the exact value on [−87.3, 88] (inputs are clamped
// to that range, so n stays a normal exponent).
const EXP_LO: f32 = -87.336_54;
const EXP_HI: f32 = 88.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5, // Cephes: 5.0000001201e-1, which is 0.5 in f32
];

/// `e^x` (f32): the scalar definition the AVX2 version reproduces bit for bit.
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `h = silu(g)·u = g / (1 + e^(−g)) · u`, elementwise (the MLP's gate times its up
/// projection; PyTorch's SiLU formula).
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    silu_mul_with(super::isa(), gate, up)
}

/// [`silu_mul`] at level `isa`, lowered to what this process may use.
pub(crate) fn silu_mul_with(isa: super::Isa, gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut h = gate.to_vec();
    silu_mul_in_place_with(isa, &mut h, up);
    h
}

/// [`silu_mul`] written over the gate (the MLP then holds one activation buffer fewer).
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    silu_mul_in_place_with(super::isa(), gate, up)
}

/// [`silu_mul_in_place`] at level `isa`, lowered to what this process may use.
fn silu_mul_in_place_with(isa: super::Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate/up shapes");
    let isa = isa.min(super::isa());
    const CHUNK: usize = 1 << 14;
    gate.par_chunks_mut(CHUNK)
        .zip(up.par_chunks(CHUNK))
        .for_each(|(gate, up)| {
            #[cfg(target_arch = "x86_64")]
            {
                match isa {
                    // SAFETY: AVX-512F was detected and seen to execute; equal lengths.
                    super::Isa::Avx512 | super::Isa::Avx512Bf16 | super::Isa::Amx => {
                        return unsafe { avx512::silu_mul(gate, up) }
                    }
                    // SAFETY: AVX2 and FMA were detected and seen to execute; equal lengths.
                    super::Isa::Avx2 => return unsafe { avx2::silu_mul(gate, up) },
                    super::Isa::Portable => {}
                }
            }
            let _ = isa;
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = silu_mul_one(*g, u);
            }
        });
}

/// Elements per parallel task of the elementwise operations below.
const ELEMENTWISE_CHUNK: usize = 1 << 14;

/// `a + b`, elementwise, on the caller's thread pool (the residual stream). candle's add
/// runs on a pool of its own whose workers spin at a barrier after every call, competing
/// with ours for the cores; the sums are the same bits.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    assert_eq!(a.len(), b.len(), "add shapes");
    a.par_iter()
        .with_min_len(ELEMENTWISE_CHUNK)
        .zip(b.par_iter())
        .map(|(&x, &y)| x + y)
        .collect()
}

/// `gelu(g)·u` with GELU's tanh approximation, elementwise on the caller's thread pool:
/// candle's `gelu` and `mul` written in one pass, operation for operation, with glibc's
/// `tanhf` reproduced bit for bit ([`super::gelu`]), so the values are the same bits as
/// `(gate.gelu()? * up)?` on glibc 2.36 at every instruction level.
pub fn gelu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    super::gelu::gelu_mul_with(super::isa(), gate, up)
}

fn silu_mul_one(g: f32, u: f32) -> f32 {
    g / (1.0 + exp(-g)) * u
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_in_place(xs: &mut [f32], shift: f32) {
        let s = _mm256_set1_ps(shift);
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            let x = _mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), s);
            _mm256_storeu_ps(c.as_mut_ptr(), exp8(x));
        }
        for x in chunks.into_remainder() {
            *x = super::exp(*x - shift);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
            _mm256_set1_ps(EXP_HI),
        );
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let n = _mm256_round_ps::<NEAREST>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)));
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        assert!(gate.len() == up.len());
        let n8 = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        for i in (0..n8).step_by(8) {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = exp8(_mm256_xor_ps(g, sign));
            let y = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), y);
        }
        for i in n8..gate.len() {
            gate[i] = super::silu_mul_one(gate[i], up[i]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_in_place(xs: &mut [f32], shift: f32) {
        let s = _mm512_set1_ps(shift);
        let mut chunks = xs.chunks_exact_mut(16);
        for c in &mut chunks {
            let x = _mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), s);
            _mm512_storeu_ps(c.as_mut_ptr(), exp16(x));
        }
        for x in chunks.into_remainder() {
            *x = super::exp(*x - shift);
        }
    }

    /// The AVX2 `exp8`, operation for operation, on sixteen lanes.
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
            _mm512_set1_ps(EXP_HI),
        );
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let n = _mm512_roundscale_ps::<NEAREST>(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)));
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(y, _mm512_castsi512_ps(e))
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        assert!(gate.len() == up.len());
        let n16 = gate.len() / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        for i in (0..n16).step_by(16) {
            let g = _mm512_loadu_ps(gate.as_ptr().add(i));
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let minus_g = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(g),
                _mm512_set1_epi32(i32::MIN),
            ));
            let e = exp16(minus_g);
            let y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
            _mm512_storeu_ps(gate.as_mut_ptr().add(i), y);
        }
        for i in n16..gate.len() {
            gate[i] = super::silu_mul_one(gate[i], up[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::panel::tests::lcg;
    use super::*;

    #[test]
    fn add_and_gelu_mul_are_candles_bits() {
        use candle_core::{Device, Tensor};
        let mut seed = 11;
        // Longer than one task, not a multiple of it; extreme and special values too.
        let mut a: Vec<f32> = (0..40_003).map(|_| lcg(&mut seed) * 20.0 - 10.0).collect();
        let mut b: Vec<f32> = (0..40_003).map(|_| lcg(&mut seed) * 6.0 - 3.0).collect();
        let specials = [
            0.0,
            -0.0,
            1e-30,
            -1e30,
            3.4e38,
            f32::MIN_POSITIVE,
            88.0,
            -88.0,
        ];
        a[..specials.len()].copy_from_slice(&specials);
        b[7..7 + specials.len()].copy_from_slice(&specials);
        let ta = Tensor::from_slice(&a, a.len(), &Device::Cpu).unwrap();
        let tb = Tensor::from_slice(&b, b.len(), &Device::Cpu).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let sum = (&ta + &tb).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(bits(&add(&a, &b)), bits(&sum));
        let gm = (ta.gelu().unwrap() * &tb)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(bits(&gelu_mul(&a, &b)), bits(&gm));
        // And the values are GELU's: 0 at 0, x for large x, ~0.8412 at 1.
        assert_eq!(gelu_mul(&[0.0, 1.0, 10.0], &[1.0; 3])[0], 0.0);
        assert!((gelu_mul(&[1.0], &[1.0])[0] - 0.841_192).abs() < 1e-5);
        assert_eq!(gelu_mul(&[10.0], &[2.0])[0], 20.0);
    }

    #[test]
    fn every_isa_level_gives_the_same_bits_and_exp_is_accurate() {
        let mut seed = 37;
        let mut xs: Vec<f32> = (0..1000).map(|_| lcg(&mut seed) * 100.0 - 50.0).collect();
        xs.extend([
            0.0,
            -0.0,
            -87.0,
            -88.0,
            -1e30,
            88.0,
            -0.5 * std::f32::consts::LN_2,
        ]);
        let up: Vec<f32> = (0..xs.len()).map(|_| lcg(&mut seed)).collect();
        for isa in super::super::panel::tests::available_isas() {
            let mut simd = xs.clone();
            exp_in_place_with(isa, &mut simd);
            for (x, e) in xs.iter().zip(&simd) {
                assert_eq!(exp(*x).to_bits(), e.to_bits(), "{isa:?} exp({x})");
                if *x > -80.0 {
                    let rel = (*e as f64 - (*x as f64).exp()).abs() / (*x as f64).exp();
                    assert!(rel < 3e-7, "exp({x}) = {e}, rel error {rel:e}");
                }
            }
            let h = silu_mul_with(isa, &xs, &up);
            for ((&g, &u), &h) in xs.iter().zip(&up).zip(&h) {
                let want_bits = silu_mul_one(g, u).to_bits();
                assert_eq!(h.to_bits(), want_bits, "{isa:?} silu({g})·{u}");
                let want = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
                assert!(
                    (h as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "silu({g})·{u}"
                );
            }
        }
    }
}
