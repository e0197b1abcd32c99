use super::super::half_driver::tests::{
    check_levels, check_rows_stand_alone, naive as naive_products, random_x, SHAPES,
};
use super::super::panel::tests::lcg;
use super::*;

/// Random weights of `kind`, spread over several binades, as file bytes.
fn random_bytes(kind: HalfType, n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    (0..n * k)
        .flat_map(|_| {
            let v = lcg(seed) * 2f32.powi((lcg(seed) * 6.0) as i32);
            let bits = match kind {
                HalfType::F16 => f16::from_f32(v).to_bits(),
                HalfType::Bf16 => ::half::bf16::from_f32(v).to_bits(),
            };
            bits.to_le_bytes()
        })
        .collect()
}

super::super::half_driver::tests::product_of!(HalfMatrix);

/// The widened weights times the rounded activations, in f64, and the sum of the products'
/// magnitudes.
fn naive(w: &HalfMatrix, x: &[f32]) -> Vec<(f64, f64)> {
    let (k, kind) = (w.k, w.kind);
    naive_products(
        w.shape(),
        x,
        |j, e| kind.widen(w.bits[j * k + e]) as f64,
        |x| kind.round(x) as f64,
    )
}

fn levels() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&l| l <= cpu_level())
        .collect()
}

#[test]
fn matches_naive_reference_and_every_path_gives_the_same_bits() {
    let mut seed = 17;
    for kind in [HalfType::F16, HalfType::Bf16] {
        for &(m, n, k) in &SHAPES {
            let w = HalfMatrix::from_bytes(kind, &random_bytes(kind, n, k, &mut seed), n, k)
                .expect("layout");
            let x = random_x(m * k, &mut seed);
            let what = format!("{kind:?} ({m},{n},{k})");
            check_levels(&w, (&x, m), &naive(&w, &x), &levels(), &what);
        }
    }
}

#[test]
fn activations_round_as_ggml_does() {
    // bf16: ties to even, NaN kept quiet.
    let bf = |x: f32| HalfType::Bf16.round(x).to_bits();
    assert_eq!(bf(f32::from_bits(0x3f80_8000)), 0x3f80_0000);
    assert_eq!(bf(f32::from_bits(0x3f81_8000)), 0x3f82_0000);
    assert_eq!(bf(f32::from_bits(0x3f80_8001)), 0x3f81_0000);
    assert_eq!(bf(f32::from_bits(0x7f7f_ffff)), 0x7f80_0000);
    assert!(HalfType::Bf16.round(f32::NAN).is_nan());
    assert_eq!(bf(f32::from_bits(0x7f80_0001)), 0x7fc0_0000);
    // f16: nearest even, overflow to infinity, subnormals kept.
    assert_eq!(HalfType::F16.round(1.0 + 1.0 / 2048.0), 1.0);
    assert_eq!(HalfType::F16.round(70000.0), f32::INFINITY);
    assert_eq!(HalfType::F16.round(1e-7), 2f32.powi(-24) * 2.0);
    // The SIMD rounding gives the same bits, specials included.
    let mut seed = 3;
    let mut values: Vec<f32> = (0..4096)
        .map(|_| f32::from_bits((lcg(&mut seed).to_bits() ^ (seed as u32)).rotate_left(7)))
        .collect();
    values.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        65520.0,
        65519.0,
        1e-8,
    ]);
    values.truncate(values.len() / 8 * 8);
    for kind in [HalfType::F16, HalfType::Bf16] {
        for isa in levels() {
            for src in values.chunks_exact(8) {
                let mut dst = [0f32; 8];
                round8(kind, src, &mut dst, isa);
                for (d, &s) in dst.iter().zip(src) {
                    assert_eq!(
                        d.to_bits(),
                        kind.round(s).to_bits(),
                        "{kind:?} {isa:?} {s:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn rows_do_not_depend_on_their_neighbours_or_the_thread_count() {
    let mut seed = 5;
    let (n, k) = (41, 72);
    for kind in [HalfType::F16, HalfType::Bf16] {
        let w = HalfMatrix::from_bytes(kind, &random_bytes(kind, n, k, &mut seed), n, k)
            .expect("layout");
        check_rows_stand_alone(&w, (n, k), &mut seed);
    }
}

#[test]
fn malformed_layouts_are_refused() {
    assert!(HalfMatrix::from_bytes(HalfType::F16, &[0; 10], 2, 3).is_none());
    assert!(HalfMatrix::from_bytes(HalfType::Bf16, &[0; 12], 2, 3).is_some());
    assert!(HalfMatrix::from_bytes(HalfType::F16, &[], usize::MAX, 3).is_none());
    assert!(HalfMatrix::from_bytes(HalfType::F16, &[], 4, 0).is_none());
}

#[test]
fn dequantized_rows_equal_candles_dequantization() {
    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    use candle_core::Device;
    let mut seed = 29;
    let (n, k) = (3, 40);
    for (kind, dtype) in [
        (HalfType::F16, GgmlDType::F16),
        (HalfType::Bf16, GgmlDType::BF16),
    ] {
        let bytes = random_bytes(kind, n, k, &mut seed);
        let w = HalfMatrix::from_bytes(kind, &bytes, n, k).expect("layout");
        let storage =
            QStorage::from_data(std::borrow::Cow::Borrowed(&bytes), &Device::Cpu, dtype).unwrap();
        let q = QTensor::new(storage, (n, k)).unwrap();
        let want = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (j, want) in want.iter().enumerate() {
            let mut row = vec![0f32; k];
            w.dequantize_row(j, &mut row);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&row), bits(want), "{dtype:?} row {j}");
        }
    }
}

/// Throughput against candle's f32 matmul on the widened weights (what native precision did
/// before): `cargo test --release --lib kernels::half::tests::throughput -- --ignored
/// --nocapture` (`PPL_BENCH_THREADS`, default 2).
#[test]
#[ignore]
fn throughput_against_candles_f32_gemm() {
    use candle_core::{Device, Tensor};
    let threads = crate::test_util::bench_count("PPL_BENCH_THREADS", 2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let mut seed = 1;
    let time = |f: &mut dyn FnMut()| {
        f();
        let t = std::time::Instant::now();
        let reps = 3;
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() / reps as f64
    };
    for &(m, n, k) in &[
        (512, 8192, 2048),
        (512, 2048, 8192),
        (512, 2048, 2048),
        (64, 2048, 2048),
    ] {
        let x = random_x(m * k, &mut seed);
        let flops = 2.0 * (m * n * k) as f64;
        for kind in [HalfType::F16, HalfType::Bf16] {
            let w = HalfMatrix::from_bytes(kind, &random_bytes(kind, n, k, &mut seed), n, k)
                .expect("layout");
            let ours = |isa: Isa| {
                pool.install(|| {
                    time(&mut || {
                        std::hint::black_box(w.matmul_at(&x, m, isa));
                    })
                })
            };
            let (t512, t2) = (ours(Isa::Avx512), ours(Isa::Avx2));
            let wide: Vec<f32> = w.bits.iter().map(|&b| kind.widen(b)).collect();
            let wt = Tensor::from_vec(wide, (n, k), &Device::Cpu).unwrap();
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            // candle's gemm runs on the rayon pool of its caller.
            let tc = pool.install(|| {
                time(&mut || {
                    std::hint::black_box(xt.matmul(&wt.t().unwrap()).unwrap());
                })
            });
            println!(
                "{kind:?} m={m} [{n} x {k}] {threads} threads: ours {:.1} GFLOP/s ({}), {:.1} \
                 (avx2); candle f32 {:.1}; speed-up {:.2}x",
                flops / t512 / 1e9,
                cpu_level().name(),
                flops / t2 / 1e9,
                flops / tc / 1e9,
                tc / t512
            );
        }
    }
}
