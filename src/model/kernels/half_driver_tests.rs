//! What the float weight kernels' tests share (F16/BF16 widened, BF16 `vdpbf16ps`-ordered,
//! F32): random activations, the shapes, the f64 reference, and the checks every kernel on
//! the driver must pass.

use super::super::panel::tests::lcg;
use super::super::Isa;

/// Activations spread over several binades.
pub(crate) fn random_x(len: usize, seed: &mut u64) -> Vec<f32> {
    (0..len)
        .map(|_| lcg(seed) * 3.0 * 2f32.powi((lcg(seed) * 4.0) as i32))
        .collect()
}

/// The same bits, any NaN matching any NaN.
pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// `(m, n, k)`: rows not a multiple of the panel (8), outputs not a multiple of any tile (2, 3,
/// 6, 12), `k` not a multiple of the lanes (8), the BF16 chunk (16) or a K slice (512, 1024).
pub(crate) const SHAPES: [(usize, usize, usize); 13] = [
    (1, 1, 1),
    (3, 5, 7),
    (9, 13, 37),
    (17, 30, 64),
    (8, 25, 200),
    (33, 12, 129),
    (5, 4, 8),
    (5, 4, 16),
    (12, 49, 576),
    (2, 7, 1100),
    (19, 23, 1100),
    // Enough panels that the threads split them (not the weight rows), more weight rows than
    // one cache block, several K slices; the second with tail values.
    (300, 203, 1040),
    (131, 100, 1043),
];

/// The products `weight(j, e) · act(x[row, e])` summed in f64 per output, with the sum of their
/// magnitudes (the scale of f32's rounding error): `[m, n]`.
pub(crate) fn naive(
    (n, k): (usize, usize),
    x: &[f32],
    weight: impl Fn(usize, usize) -> f64,
    act: impl Fn(f32) -> f64,
) -> Vec<(f64, f64)> {
    let m = x.len() / k;
    let mut out = Vec::with_capacity(m * n);
    for row in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (0f64, 0f64);
            for e in 0..k {
                let p = weight(j, e) * act(x[row * k + e]);
                s += p;
                mag += p.abs();
            }
            out.push((s, mag));
        }
    }
    out
}

/// A matrix's product at a level (`matmul_at`) and at the process's level (`matmul`).
pub(crate) trait Product: Sync {
    fn at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32>;
    fn default_level(&self, x: &[f32], m: usize) -> Vec<f32>;
}

/// The portable product of `x [m, k]` within 1e-6 of its magnitude of the f64 reference
/// `want`, and every level in `levels` (and the process's own) the portable path's bits;
/// returns the portable product.
pub(crate) fn check_levels(
    w: &impl Product,
    (x, m): (&[f32], usize),
    want: &[(f64, f64)],
    levels: &[Isa],
    what: &str,
) -> Vec<f32> {
    let portable = w.at(x, m, Isa::Portable);
    assert_eq!(portable.len(), want.len(), "{what}");
    for (i, (&g, &(e, mag))) in portable.iter().zip(want).enumerate() {
        let g = g as f64;
        assert!(
            (g - e).abs() <= 1e-6 * mag + 1e-30,
            "{what} [{i}] {g} vs {e}"
        );
    }
    for &isa in levels {
        let got = w.at(x, m, isa);
        assert!(
            same_bits(&got, &portable),
            "{what} {isa:?} differs from portable"
        );
    }
    assert!(same_bits(&w.default_level(x, m), &portable), "{what}");
    portable
}

/// Each output row the same bits whether computed alone, with other rows, after dropped
/// rows, or on 1, 3 or 8 threads (`[n, k]` weights; 201 rows are 26 panels: split by panels up
/// to 3 threads, by weight rows beyond).
pub(crate) fn check_rows_stand_alone(w: &impl Product, (n, k): (usize, usize), seed: &mut u64) {
    let m = 201;
    let x = random_x(m * k, seed);
    let all = w.default_level(&x, m);
    for r in [0, 5, 16, 36, 200] {
        let one = w.default_level(&x[r * k..(r + 1) * k], 1);
        assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
    }
    let tail = w.default_level(&x[3 * k..], m - 3);
    assert_eq!(&all[3 * n..], tail.as_slice());
    for threads in [1, 3, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        assert_eq!(pool.install(|| w.default_level(&x, m)), all);
        let few = pool.install(|| w.default_level(&x[..3 * k], 3));
        assert_eq!(few.as_slice(), &all[..3 * n]);
    }
}

/// [`Product`] for a kernel's matrix type (its inherent `matmul_at` and `matmul`).
macro_rules! product_of {
    ($matrix:ty) => {
        impl $crate::model::kernels::half_driver::tests::Product for $matrix {
            fn at(&self, x: &[f32], m: usize, isa: $crate::model::kernels::Isa) -> Vec<f32> {
                self.matmul_at(x, m, isa)
            }

            fn default_level(&self, x: &[f32], m: usize) -> Vec<f32> {
                self.matmul(x, m)
            }
        }
    };
}
pub(crate) use product_of;

#[test]
fn sub_slices_cover_the_chunks_in_order() {
    use super::sub_slices;
    let pieces: Vec<_> = sub_slices(64..200, 64).collect();
    assert_eq!(pieces, vec![64..128, 128..192, 192..200]);
    assert_eq!(sub_slices(0..64, 64).collect::<Vec<_>>(), vec![0..64]);
    assert_eq!(sub_slices(5..5, 64).count(), 0);
}
