//! The checks every format of the driver passes: each format's test module implements
//! [`Case`] and invokes [`format_tests!`], and adds the checks of its own (extreme blocks,
//! the bits of the kernel it replaced, its memory).

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;

use super::tiles::Emulated;
use super::{Activations, Format, Rows16Matrix};
use crate::model::kernels::panel::tests::{available_isas, lcg};
use crate::model::kernels::{isa, isa_choice, Isa};

/// A format under test: random file bytes and the GGUF definition of its values.
pub(crate) trait Case: Format {
    /// candle's type of the format (its dequantization is the reference for ours), or of the
    /// form candle reads its values in ([`Case::candle_bytes`]).
    const DTYPE: GgmlDType;
    /// The file's bytes as candle reads them as [`Case::DTYPE`]: the same, but for IQ4_NL.
    fn candle_bytes(file: &[u8]) -> Vec<u8> {
        file.to_vec()
    }
    /// `(m, n, k)`: rows not a multiple of the panel or the group, n not a multiple of the
    /// driver's 128-row cache block, one to many blocks per row.
    const SHAPES: &'static [(usize, usize, usize)];
    /// Random file bytes of a `[n, k]` matrix.
    fn random(n: usize, k: usize, seed: &mut u64) -> Vec<u8>;
    /// Value `e` of a file block by the GGUF definition (from the file's bytes, not from our
    /// layout), in f64, less the block's minimum ([`Case::minimum`]).
    fn reference(block: &[u8], e: usize) -> f64;
    /// The value every element of a file block adds (Q4_1's `m`), multiplied by the
    /// activations' block sum as the kernels form it ([`Activations::block_sum`]).
    fn minimum(block: &[u8]) -> f64 {
        let _ = block;
        0.0
    }
}

/// [`Case::SHAPES`] of the K-quant formats (256-value super-blocks): one, two, three and nine
/// super-blocks per row, rows of panels and groups cut short.
pub(crate) const SUPER_BLOCK_SHAPES: &[(usize, usize, usize)] = &[
    (1, 5, 256),
    (7, 9, 512),
    (8, 3, 2304),
    (9, 130, 256),
    (17, 33, 512),
    (2, 1, 2304),
    (16, 16, 768),
];

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The file's weights times the dequantized activations, in f64, and the sum of the terms'
/// magnitudes (the scale of the rounding error).
fn naive<F: Case>(bytes: &[u8], (n, k): (usize, usize), x: &[f32], m: usize) -> Vec<(f64, f64)> {
    let block = F::Act::BLOCK;
    let nb = k / block;
    let a = F::Act::quantize(x, m, k);
    let mut out = vec![(0f64, 0f64); m * n];
    for row in 0..m {
        for j in 0..n {
            let (mut want, mut size) = (0f64, 0f64);
            for b in 0..nb {
                let blk = &bytes[(j * nb + b) * F::FILE_BLOCK_BYTES..][..F::FILE_BLOCK_BYTES];
                for e in 0..block {
                    let term = F::reference(blk, e) * a.dequantized(row, b * block + e);
                    want += term;
                    size += term.abs();
                }
                let minimum = F::minimum(blk);
                if minimum != 0.0 {
                    let term = minimum * a.block_sum(row, b);
                    want += term;
                    size += term.abs();
                }
            }
            out[row * n + j] = (want, size);
        }
    }
    out
}

/// `w`'s product with the AMX micro-kernel on emulated tiles, where this CPU runs the
/// kernel's AVX-512 epilogue; `None` elsewhere.
pub(crate) fn emulated_amx<F: Format>(
    w: &Rows16Matrix<F>,
    x: &[f32],
    m: usize,
) -> Option<Vec<f32>> {
    // A format with a staged tile kernel has no per-job one.
    if isa() < Isa::Avx512 || F::STAGED_BLOCK_BYTES > 0 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    return Some(w.matmul_with(x, m, |job| {
        // SAFETY: AVX-512 executes (checked above); the driver checked the job's lengths;
        // emulated tiles need nothing of the CPU.
        unsafe { F::amx(&mut Emulated::default(), job) }.expect("the format has an AMX path")
    }));
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The product of `bytes` against the f64 reference (relative 10⁻⁵ of the terms' magnitudes),
/// and every level this CPU runs, the AMX kernel on emulated tiles and the default path, bit
/// for bit against the portable one.
/// The product through the staged tile kernel on emulated tiles, where `F` has one and this
/// process has AVX-512 (the kernel's vector half).
pub(crate) fn emulated_staged_amx<F: Format>(
    w: &Rows16Matrix<F>,
    x: &[f32],
    m: usize,
) -> Option<Vec<f32>> {
    if isa() < Isa::Avx512 || F::STAGED_BLOCK_BYTES == 0 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let a = F::Act::quantize(x, m, w.k);
        // SAFETY: AVX-512 was detected and seen to execute; the tiles are emulated.
        let run = |passes| unsafe { w.matmul_staged(&a, m, Emulated::default, passes) };
        let whole = run(super::STAGED_PASSES);
        // Passes of two panels and slices of one block: every group staged again per pass
        // and slice, its accumulators carried between slices, the same bits.
        let smallest = super::StagedPasses {
            bytes: 0,
            min_slice: 1,
        };
        assert_eq!(
            bits(&run(smallest)),
            bits(&whole),
            "{} in passes of two panels and slices of one block",
            F::NAME
        );
        Some(whole)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

pub(crate) fn check_bytes<F: Case>(bytes: &[u8], (n, k): (usize, usize), x: &[f32], m: usize) {
    let w = Rows16Matrix::<F>::from_bytes(bytes, n, k).expect("layout");
    let portable = w.matmul_at(x, m, Isa::Portable);
    for (i, (&g, &(want, size))) in portable
        .iter()
        .zip(&naive::<F>(bytes, (n, k), x, m))
        .enumerate()
    {
        assert!(
            (g as f64 - want).abs() <= 1e-5 * size + 1e-30,
            "{} ({m},{n},{k}) [{i}] {g} vs {want} (size {size})",
            F::NAME
        );
    }
    for level in available_isas() {
        assert_eq!(
            bits(&w.matmul_at(x, m, level)),
            bits(&portable),
            "{} {level:?} ({m},{n},{k})",
            F::NAME
        );
    }
    if let Some(amx) = emulated_amx(&w, x, m) {
        assert_eq!(
            bits(&amx),
            bits(&portable),
            "{} emulated AMX ({m},{n},{k})",
            F::NAME
        );
    }
    if let Some(staged) = emulated_staged_amx(&w, x, m) {
        assert_eq!(
            bits(&staged),
            bits(&portable),
            "{} emulated staged AMX ({m},{n},{k})",
            F::NAME
        );
    }
    assert_eq!(bits(&w.matmul(x, m)), bits(&portable));
}

/// [`check_bytes`] on 19 rows of two blocks, block `b` of the file written by `block(b)`
/// (the format's extreme values), against ±100 activations (quantized to ±127): mixed signs,
/// and all of one sign (the largest sums of one sign, which the AVX2 kernels form in 16 bits
/// over several steps, so a bound off by one step wraps here).
pub(crate) fn check_extreme_blocks<F: Case>(block: impl Fn(usize) -> Vec<u8>) {
    let (n, k) = (19, 2 * F::Act::BLOCK);
    let bytes: Vec<u8> = (0..n * 2).flat_map(&block).collect();
    let mixed = |i: usize| if i.is_multiple_of(3) { 100.0 } else { -100.0 };
    let patterns: [&dyn Fn(usize) -> f32; 3] = [&mixed, &|_| 100.0, &|_| -100.0];
    for pattern in patterns {
        let x: Vec<f32> = (0..9 * k).map(pattern).collect();
        check_bytes::<F>(&bytes, (n, k), &x, 9);
    }
}

/// [`check_bytes`] on random weights of every shape of the case.
pub(crate) fn check_levels<F: Case>(mut seed: u64) {
    for &(m, n, k) in F::SHAPES {
        let bytes = F::random(n, k, &mut seed);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        check_bytes::<F>(&bytes, (n, k), &x, m);
    }
}

/// Dequantized rows equal candle's dequantization of the file's bytes, bit for bit.
pub(crate) fn check_dequantization<F: Case>(mut seed: u64) {
    let (n, k) = (19, 2 * F::Act::BLOCK);
    let bytes = F::random(n, k, &mut seed);
    let w = Rows16Matrix::<F>::from_bytes(&bytes, n, k).expect("layout");
    let candle_bytes = std::borrow::Cow::Owned(F::candle_bytes(&bytes));
    let storage =
        QStorage::from_data(candle_bytes, &Device::Cpu, F::DTYPE).expect("candle storage");
    let want = QTensor::new(storage, (n, k))
        .and_then(|q| q.dequantize(&Device::Cpu))
        .and_then(|t| t.to_vec2::<f32>())
        .expect("candle dequantization");
    for (j, want) in want.iter().enumerate() {
        let mut row = vec![0f32; k];
        w.dequantize_row(j, &mut row);
        assert_eq!(bits(&row), bits(want), "{} row {j}", F::NAME);
    }
}

/// An output depends on its activation row and weight row only: not on the other rows of the
/// panel, the panel the row lands in, or the thread count.
pub(crate) fn check_independence<F: Case>(mut seed: u64) {
    let (n, k) = (40, 2 * F::Act::BLOCK);
    let w = Rows16Matrix::<F>::from_bytes(&F::random(n, k, &mut seed), n, k).expect("layout");
    let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
    let all = w.matmul(&x, 37);
    for r in [0, 5, 16, 36] {
        let one = w.matmul(&x[r * k..(r + 1) * k], 1);
        assert_eq!(bits(&all[r * n..(r + 1) * n]), bits(&one));
    }
    let tail = w.matmul(&x[3 * k..], 34);
    assert_eq!(bits(&all[3 * n..]), bits(&tail));
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        assert_eq!(bits(&pool.install(|| w.matmul(&x, 37))), bits(&all));
    }
}

/// Sizes that are not the format's are refused, and memory is the group blocks.
pub(crate) fn check_sizes<F: Case>() {
    let block = F::Act::BLOCK;
    let bytes = vec![0u8; 17 * 2 * F::FILE_BLOCK_BYTES];
    let w = Rows16Matrix::<F>::from_bytes(&bytes, 17, 2 * block).expect("layout");
    // 17 rows: a second group, padded with zero rows.
    assert_eq!(w.storage_bytes(), 2 * 2 * F::GROUP_BLOCK_BYTES);
    assert!(Rows16Matrix::<F>::from_bytes(&bytes[1..], 17, 2 * block).is_none());
    assert!(Rows16Matrix::<F>::from_bytes(&bytes, 17, 2 * block - 1).is_none());
    assert!(Rows16Matrix::<F>::from_bytes(&bytes, 16, 2 * block).is_none());
    assert!(Rows16Matrix::<F>::from_bytes(&[], 1, 0).is_none());
}

/// On a CPU whose tile unit this process uses, the hardware AMX path gives the emulated
/// tiles' bits (and so the portable path's); elsewhere the test says it was skipped, and
/// fails under `PPL_REQUIRE_AMX=1`.
pub(crate) fn check_hardware_amx<F: Case>(mut seed: u64) {
    let choice = isa_choice();
    if choice.used < Isa::Amx {
        crate::model::kernels::tests::amx_skipped(&choice);
        return;
    }
    for &(m, n, k) in F::SHAPES {
        let bytes = F::random(n, k, &mut seed);
        let w = Rows16Matrix::<F>::from_bytes(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let portable = w.matmul_at(&x, m, Isa::Portable);
        assert_eq!(
            bits(&w.matmul_at(&x, m, Isa::Amx)),
            bits(&portable),
            "{}",
            F::NAME
        );
    }
}

/// Throughput per level, in GOP/s (two operations per multiply-add), and for AMX the fraction
/// of the tile unit's peak measured here ([`super::tiles::peak_gops`]).
pub(crate) fn throughput<F: Case>() {
    let mut seed = 1;
    let threads = rayon::current_num_threads();
    let peak = super::tiles::peak_gops().map(|per_thread| per_thread * threads as f64);
    // The fastest of `PPL_BENCH_REPS` runs (default 3): a noisy machine only slows runs down.
    let reps = crate::test_util::bench_count("PPL_BENCH_REPS", 3);
    // `PPL_BENCH_SHAPES=NxK,NxK` (weights `[n, k]`, 512 activation rows) replaces the default
    // shapes, e.g. a model's output matrix `128256x2048`.
    let shapes: Vec<(usize, usize, usize)> = match std::env::var("PPL_BENCH_SHAPES") {
        Ok(list) => list
            .split(',')
            .map(|shape| {
                let (n, k) = shape.split_once('x').expect("PPL_BENCH_SHAPES: NxK,NxK");
                let parse = |v: &str| v.trim().parse().expect("PPL_BENCH_SHAPES: NxK,NxK");
                (512, parse(n), parse(k))
            })
            .collect(),
        Err(_) => vec![(512, 8192, 2048), (512, 2048, 8192), (512, 1536, 576)],
    };
    for (m, n, k) in shapes {
        if !k.is_multiple_of(F::Act::BLOCK) {
            continue;
        }
        let w = Rows16Matrix::<F>::from_bytes(&F::random(n, k, &mut seed), n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let ops = 2.0 * (m * n * k) as f64;
        let mut line = format!("{} m={m} [{n} x {k}] {threads} threads GOP/s:", F::NAME);
        for level in available_isas().into_iter().filter(|&l| l >= Isa::Avx2) {
            w.matmul_at(&x, m, level);
            let fastest = (0..reps)
                .map(|_| {
                    let t = std::time::Instant::now();
                    std::hint::black_box(w.matmul_at(&x, m, level));
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            let gops = ops / fastest / 1e9;
            line += &format!(" {}={gops:.1}", level.name());
            if let (Isa::Amx, Some(peak)) = (level, peak) {
                line += &format!(" ({:.0}% of the tile peak {peak:.0})", 100.0 * gops / peak);
            }
        }
        if let Some(staging) = staging_seconds(&w, reps) {
            println!(
                "{} [{n} x {k}] staging for the tiles: {:.2} ms per product, {threads} threads",
                F::NAME,
                1e3 * staging
            );
        }
        println!("{line}");
    }
    if peak.is_none() {
        println!(
            "{}: AMX SKIPPED (not in use here: {})",
            F::NAME,
            isa_choice().summary()
        );
    }
}

/// The fastest of `reps` stagings of every group of `w` for the staged tile kernel
/// ([`Format::stage`]), in slices of eight blocks as the kernel stages them when one pass
/// holds all of a product's panels (512 rows of the smaller models), the groups split over the
/// threads: the vector half of the tile level's work, which runs (and is timed) wherever
/// AVX-512 does, with or without a tile unit. `None` where `F` has no staged kernel or
/// AVX-512 does not run here.
fn staging_seconds<F: Format>(w: &Rows16Matrix<F>, reps: usize) -> Option<f64> {
    if F::STAGED_BLOCK_BYTES == 0 || isa() < Isa::Avx512 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use rayon::prelude::*;
        const SLICE: usize = 8;
        let nb = w.k / F::Act::BLOCK;
        let stage_all = || {
            (0..w.n.div_ceil(super::GROUP))
                .into_par_iter()
                .for_each_init(
                    || vec![0u8; SLICE * F::STAGED_BLOCK_BYTES],
                    |staged, g| {
                        for b in (0..nb).step_by(SLICE) {
                            // SAFETY: AVX-512 runs here (checked above); `staged` holds a slice.
                            unsafe { F::stage(w.group(g), nb, b..(b + SLICE).min(nb), staged) };
                        }
                        std::hint::black_box(&staged[..]);
                    },
                )
        };
        let fastest = (0..reps.max(1))
            .map(|_| {
                let t = std::time::Instant::now();
                stage_all();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        Some(fastest)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, reps);
        None
    }
}

/// The shared tests of a format: `format_tests!(Format, seed)` in its test module.
macro_rules! format_tests {
    ($format:ty, $seed:expr) => {
        #[test]
        fn matches_the_reference_and_every_level_gives_the_same_bits() {
            $crate::model::kernels::rows16::tests::check_levels::<$format>($seed);
        }

        #[test]
        fn the_hardware_tiles_give_the_same_bits() {
            $crate::model::kernels::rows16::tests::check_hardware_amx::<$format>($seed + 1);
        }

        #[test]
        fn dequantized_rows_equal_candles() {
            $crate::model::kernels::rows16::tests::check_dequantization::<$format>($seed + 2);
        }

        #[test]
        fn rows_do_not_depend_on_their_neighbours_or_the_thread_count() {
            $crate::model::kernels::rows16::tests::check_independence::<$format>($seed + 3);
        }

        #[test]
        fn malformed_sizes_are_refused() {
            $crate::model::kernels::rows16::tests::check_sizes::<$format>();
        }

        /// Throughput per level: `cargo test --release --lib rows16::<format>::tests::throughput
        /// -- --ignored --nocapture` (`PPL_BENCH_REPS` runs per figure, the fastest reported).
        #[test]
        #[ignore]
        fn throughput() {
            $crate::model::kernels::rows16::tests::throughput::<$format>();
        }
    };
}
pub(crate) use format_tests;
