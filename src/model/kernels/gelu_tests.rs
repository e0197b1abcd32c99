use super::super::panel::tests::available_isas;
use super::*;

/// Whether two results are the same bits (any NaN matching any NaN).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every f32 with bit pattern `i·step` (both signs, every exponent), plus the edges of the
/// scalar code's branches.
fn sample(step: usize) -> Vec<f32> {
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(step).map(f32::from_bits).collect();
    for b in [
        0x2400_0000u32,
        0x23ff_ffff,
        0x3f80_0000,
        0x3f7f_ffff,
        0x41b0_0000,
        0x41af_ffff,
        0x3eb1_7218,
        0x3eb1_7219,
        0x3f85_1591,
        0x3f85_1592,
        0x3300_0000,
        0x32ff_ffff,
        0x7f80_0000,
        0x7fc0_0001,
        0,
    ] {
        xs.push(f32::from_bits(b));
        xs.push(-f32::from_bits(b));
    }
    xs
}

/// The definition is glibc 2.36's `tanhf` (and `expm1f`): the system libm, where it is that
/// one, gives the same bits on a sample of every binade (the full check is the ignored test
/// below). A libm with another algorithm (glibc ≥ 2.41's correctly rounded ones) may differ
/// in the last bit, which is why this module does not call it.
#[test]
fn tanhf_and_expm1f_are_glibcs() {
    let xs = sample(4099);
    let bad: Vec<f32> = xs
        .par_iter()
        .copied()
        .filter(|&x| !same(tanhf(x), x.tanh()) || !same(expm1f(x), x.exp_m1()))
        .collect();
    assert!(
        bad.is_empty(),
        "{} differ, e.g. {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    // And values of tanh, whatever the libm: fixed bits of the definition.
    assert_eq!(tanhf(0.5).to_bits(), 0x3eec_9a9f);
    assert_eq!(tanhf(-3.0).to_bits(), 0xbf7e_bbe9);
    assert_eq!(tanhf(30.0), 1.0);
    assert_eq!(tanhf(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(tanhf(f32::NEG_INFINITY), -1.0);
    assert!(tanhf(f32::NAN).is_nan());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx512_tanh_is_the_definition_bit_for_bit() {
    if super::super::isa() < Isa::Avx512 {
        return;
    }
    let xs = sample(257);
    let mut simd = xs.clone();
    simd.par_chunks_mut(1 << 16)
        // SAFETY: AVX-512F was detected and seen to execute.
        .for_each(|c| unsafe { avx512::tanh_slice(c) });
    for (x, t) in xs.iter().zip(&simd) {
        assert!(same(*t, tanhf(*x)), "tanh({x:e}): {t:e} vs {:e}", tanhf(*x));
    }
}

#[test]
fn gelu_mul_gives_the_same_bits_at_every_level() {
    let mut seed = 3u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    // Gates over the range GELU meets (and its tails), 16·k + 5 of them.
    let mut gate: Vec<f32> = (0..(1 << 15) + 5).map(|_| next() * 12.0).collect();
    gate[..6].copy_from_slice(&[0.0, -0.0, 1e-30, -40.0, f32::INFINITY, 3e38]);
    let up: Vec<f32> = (0..gate.len()).map(|_| next() * 3.0).collect();
    let want: Vec<u32> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| gelu_mul_one(g, u).to_bits())
        .collect();
    for isa in available_isas() {
        let got: Vec<u32> = gelu_mul_with(isa, &gate, &up)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got, want, "{isa:?}");
    }
    // GELU's values: 0 at 0, x for large x, about 0.8412 at 1.
    assert_eq!(gelu_mul_one(0.0, 1.0), 0.0);
    assert!((gelu_mul_one(1.0, 1.0) - 0.841_192).abs() < 1e-5);
    assert_eq!(gelu_mul_one(10.0, 2.0), 20.0);
}

/// All 2³² inputs: the definition against the system libm (glibc 2.36 here) and the AVX-512
/// path against the definition. About a minute on two cores:
/// `cargo test --release --lib gelu::tests::every_f32 -- --ignored`.
#[test]
#[ignore]
fn every_f32() {
    let chunks = 1u64 << 16;
    let bad: u64 = (0..chunks)
        .into_par_iter()
        .map(|c| {
            let start = (c << 16) as u32;
            let xs: Vec<f32> = (0..1u32 << 16).map(|i| f32::from_bits(start + i)).collect();
            let mut simd = xs.clone();
            #[cfg(target_arch = "x86_64")]
            if super::super::isa() >= Isa::Avx512 {
                // SAFETY: AVX-512F was detected and seen to execute.
                unsafe { avx512::tanh_slice(&mut simd) };
            }
            #[cfg(not(target_arch = "x86_64"))]
            simd.iter_mut().for_each(|x| *x = tanhf(*x));
            xs.iter()
                .zip(&simd)
                .filter(|(&x, &s)| {
                    let t = tanhf(x);
                    !same(t, x.tanh()) || !same(s, t)
                })
                .count() as u64
        })
        .sum();
    assert_eq!(bad, 0);
}
