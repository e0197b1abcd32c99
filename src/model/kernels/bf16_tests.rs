use super::super::half_driver::tests::{
    check_levels, check_rows_stand_alone, naive as naive_products, random_x, same_bits, SHAPES,
};
use super::super::panel::tests::lcg;
use super::*;

/// Random BF16 weights spread over several binades, as file bytes.
fn random_bytes(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    (0..n * k)
        .flat_map(|_| {
            let v = lcg(seed) * 2f32.powi((lcg(seed) * 6.0) as i32);
            ::half::bf16::from_f32(v).to_bits().to_le_bytes()
        })
        .collect()
}

/// Random BF16 bits of every kind: zeros, denormals, tiny and ordinary normals, infinities.
fn special_bits(seed: &mut u64) -> u16 {
    let r = (lcg(seed).to_bits() ^ (*seed as u32)).rotate_left(11);
    let sign = (r as u16) & 0x8000;
    let mantissa = ((r >> 3) as u16) & 0x7f;
    match r % 8 {
        0 => sign,
        1 => sign | mantissa,                                       // denormal
        2 => sign | 0x7f80,                                         // infinity
        3 => sign | ((40 + (r >> 20) % 60) as u16) << 7 | mantissa, // tiny normal
        _ => sign | ((110 + (r >> 20) % 30) as u16) << 7 | mantissa,
    }
}

super::super::half_driver::tests::product_of!(Bf16Matrix);

/// The held weights times the rounded activations, in f64, and the sum of the products'
/// magnitudes.
fn naive(w: &Bf16Matrix, x: &[f32]) -> Vec<(f64, f64)> {
    let k = w.k;
    naive_products(
        w.shape(),
        x,
        |j, e| widen(w.bits.get()[j * k + e]) as f64,
        |x| widen(activation_bits(x)) as f64,
    )
}

/// The levels this CPU runs the BF16 kernel at: the tile unit's too where this process
/// multiplies BF16 on it (its matrices then hold the tile layout).
fn levels() -> Vec<Isa> {
    let mut levels: Vec<Isa> = [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16]
        .into_iter()
        .filter(|&l| l <= cpu_level())
        .collect();
    if super::super::bf16_tiles() {
        levels.push(Isa::Amx);
    }
    levels
}

#[test]
fn matches_naive_reference_and_every_path_gives_the_same_bits() {
    let mut seed = 17;
    for &(m, n, k) in &SHAPES {
        let w = Bf16Matrix::from_bytes(&random_bytes(n, k, &mut seed), n, k).expect("layout");
        let x = random_x(m * k, &mut seed);
        let what = format!("({m},{n},{k})");
        check_levels(&w, (&x, m), &naive(&w, &x), &levels(), &what);
    }
}

#[test]
fn zeros_denormals_tiny_values_and_infinities_give_the_same_bits_on_every_path() {
    let mut seed = 41;
    for &(m, n, k) in &[(9, 13, 37), (16, 24, 96), (3, 5, 300)] {
        // Infinities only in a few places, so that most sums stay finite.
        let value = |i: usize, seed: &mut u64| match special_bits(seed) {
            b if b & 0x7fff == 0x7f80 && !i.is_multiple_of(61) => b & 0x8000 | 0x3f80,
            b => b,
        };
        let bytes: Vec<u8> = (0..n * k)
            .flat_map(|i| value(i, &mut seed).to_le_bytes())
            .collect();
        let w = Bf16Matrix::from_bytes(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k)
            .map(|i| {
                let b = value(i + 1, &mut seed) as u32;
                // Low bits too, so that the rounding (and its carry into the exponent) is
                // exercised near the flush threshold.
                f32::from_bits(b << 16 | (seed as u32 & 0xffff))
            })
            .collect();
        let portable = w.matmul_at(&x, m, Isa::Portable);
        let finite = portable
            .iter()
            .filter(|v| v.is_finite() && **v != 0.0)
            .count();
        assert!(
            finite > portable.len() / 4,
            "{finite} of {}",
            portable.len()
        );
        for isa in levels() {
            assert!(
                same_bits(&w.matmul_at(&x, m, isa), &portable),
                "({m},{n},{k}) {isa:?}"
            );
        }
    }
}

/// A product beyond f32's range that the sum before it brings back: the fused step adds the
/// exact product (2¹²⁸ to −1.5·2¹²⁷ gives 2¹²⁶), a rounded product would be infinite. Every
/// level must give the fused step's finite bits: a kernel that rounds the products (a
/// multiply, then an add) is the same arithmetic only while no product overflows.
#[test]
fn an_overflowing_product_that_the_sum_brings_back_is_finite_on_every_path() {
    let (m, n, k) = (5, 7, 64);
    let mut w = vec![0f32; n * k];
    let mut x = vec![0f32; m * k];
    // Lane 0: chunk 0's odd product −2¹²⁷, its even one −2¹²⁶, chunk 1's odd product 2¹²⁸.
    for (r, x) in x.chunks_exact_mut(k).enumerate() {
        (x[1], x[0], x[17]) = (-(2f32.powi(64)), -(2f32.powi(64)), 2f32.powi(64));
        x[40 + r] = 1.0;
    }
    for (j, w) in w.chunks_exact_mut(k).enumerate() {
        (w[1], w[0], w[17]) = (2f32.powi(63), 2f32.powi(62), 2f32.powi(64));
        w[50 + j % 3] = 0.5;
    }
    let bytes: Vec<u8> = w
        .iter()
        .flat_map(|&v| ::half::bf16::from_f32(v).to_bits().to_le_bytes())
        .collect();
    let w = Bf16Matrix::from_bytes(&bytes, n, k).expect("layout");
    let portable = w.matmul_at(&x, m, Isa::Portable);
    assert!(
        portable
            .iter()
            .all(|v| v.is_finite() && *v >= 2f32.powi(126)),
        "{portable:?}"
    );
    for isa in levels() {
        assert!(same_bits(&w.matmul_at(&x, m, isa), &portable), "{isa:?}");
    }
}

#[test]
fn weights_in_the_file_map_are_used_in_place_with_the_same_bits() {
    use crate::model::mapped::{tests::map_of, MappedBytes};
    let mut seed = 0x5eed_f11e;
    let (n, k, m) = (37, 300, 11);
    let bytes = random_bytes(n, k, &mut seed);
    let x = random_x(m * k, &mut seed);
    let copied = Bf16Matrix::from_bytes(&bytes, n, k).expect("layout");
    // At an even offset: used in place; the same bits at every level.
    let mut file = vec![0u8; 32];
    file.extend_from_slice(&bytes);
    let mapped = MappedBytes::new(map_of(&file), 32, bytes.len()).expect("inside");
    let in_place = Bf16Matrix::from_mapped(&mapped, n, k).expect("layout");
    assert!(in_place.is_in_place() && mapped.is_kept());
    for isa in levels() {
        let want = copied.matmul_at(&x, m, isa);
        assert!(same_bits(&in_place.matmul_at(&x, m, isa), &want), "{isa:?}");
    }
    // At an odd offset (not readable as u16): copied, and not kept.
    let mut odd = vec![0u8; 33];
    odd.extend_from_slice(&bytes);
    let mapped = MappedBytes::new(map_of(&odd), 33, bytes.len()).expect("inside");
    let copy = Bf16Matrix::from_mapped(&mapped, n, k).expect("layout");
    assert!(!copy.is_in_place() && !mapped.is_kept());
    assert!(same_bits(&copy.matmul(&x, m), &copied.matmul(&x, m)));
    // A weight that must be flushed: copied (flushed), not kept.
    let mut tiny = file.clone();
    tiny[32 + 2 * 123..][..2].copy_from_slice(&0x9f7fu16.to_le_bytes());
    let mapped = MappedBytes::new(map_of(&tiny), 32, bytes.len()).expect("inside");
    let flushed = Bf16Matrix::from_mapped(&mapped, n, k).expect("layout");
    assert!(!flushed.is_in_place() && !mapped.is_kept());
    let mut row = vec![0f32; k];
    flushed.dequantize_row(0, &mut row);
    assert_eq!(row[123].to_bits(), 0x8000_0000);
    // A wrong length is refused.
    assert!(Bf16Matrix::from_mapped(&mapped, n, k + 1).is_none());
}

#[test]
fn tiny_weights_and_activations_are_held_as_signed_zeros() {
    // 2⁻⁶⁴ is kept, the next value below is not; the sign stays.
    assert_eq!(flush_below(0x1f80, WEIGHT_MIN_EXP), 0x1f80);
    assert_eq!(flush_below(0x1f7f, WEIGHT_MIN_EXP), 0);
    assert_eq!(flush_below(0x9f7f, WEIGHT_MIN_EXP), 0x8000);
    assert_eq!(flush_below(0x0001, WEIGHT_MIN_EXP), 0);
    assert_eq!(flush_below(0x7f80, WEIGHT_MIN_EXP), 0x7f80);
    assert_eq!(activation_bits(2f32.powi(-48)), 0x2780);
    assert_eq!(activation_bits(-(2f32.powi(-49))), 0x8000);
    // Rounding up into 2⁻⁴⁸ keeps the value.
    assert_eq!(activation_bits(f32::from_bits(0x277f_ffff)), 0x2780);
    assert_eq!(activation_bits(1.0 + 1.0 / 256.0), 0x3f80);
    assert_eq!(activation_bits(f32::NAN) & 0x7fc0, 0x7fc0);
    let w = Bf16Matrix::from_bytes(&[0x7f, 0x1f, 0x80, 0x3f], 1, 2).expect("layout");
    let mut row = [9f32; 2];
    w.dequantize_row(0, &mut row);
    assert_eq!(row, [0.0, 1.0]);
}

#[test]
fn simd_rounding_gives_the_scalar_bits() {
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
        f32::from_bits(0x7f80_0001),
        2f32.powi(-48),
        -(2f32.powi(-49)),
        f32::from_bits(0x277f_ffff),
        f32::from_bits(0x277f_7fff),
        1e-40,
        f32::MAX,
    ]);
    values.truncate(values.len() / CHUNK * CHUNK);
    for isa in levels() {
        for src in values.chunks_exact(CHUNK) {
            let mut dst = [0u16; CHUNK];
            round_chunk(src, &mut dst, isa);
            for (d, &s) in dst.iter().zip(src) {
                assert_eq!(*d, activation_bits(s), "{isa:?} {s:e}");
            }
        }
    }
}

/// What `vdpbf16ps` does on this CPU, checked on random inputs of every kind: per lane, the
/// odd pair's product and then the even pair's, each a fused multiply-add rounded to nearest
/// even, with denormal inputs (accumulator included) read as zero and denormal results
/// flushed to zero. On inputs as the kernel holds them (no denormals possible), that is
/// exactly the portable definition's two FMAs.
#[test]
fn vdpbf16ps_is_the_portable_definition_on_this_cpu() {
    if cpu_level() < Isa::Avx512Bf16 {
        eprintln!("no AVX-512 BF16 here: skipped");
        return;
    }
    fn daz(x: f32) -> f32 {
        if x.is_subnormal() {
            0f32.copysign(x)
        } else {
            x
        }
    }
    let emulated = |acc: f32, a: [u16; 2], b: [u16; 2]| {
        let t = daz(daz(widen(a[1])).mul_add(daz(widen(b[1])), daz(acc)));
        daz(daz(widen(a[0])).mul_add(daz(widen(b[0])), t))
    };
    let portable = |acc: f32, a: [u16; 2], b: [u16; 2]| {
        let t = widen(a[1]).mul_add(widen(b[1]), acc);
        widen(a[0]).mul_add(widen(b[0]), t)
    };
    let mut seed = 7;
    let (mut flushed_cases, mut checked) = (0, 0);
    for round in 0..4000 {
        let held = round % 2 == 1;
        let mut a = [0u16; 32];
        let mut b = [0u16; 32];
        for (a, b) in a.iter_mut().zip(b.iter_mut()) {
            (*a, *b) = (special_bits(&mut seed), special_bits(&mut seed));
            if held {
                *a = flush_below(*a, WEIGHT_MIN_EXP);
                *b = flush_below(*b, ACTIVATION_MIN_EXP);
            }
        }
        let acc: [f32; 16] = std::array::from_fn(|i| {
            if held {
                0.0
            } else {
                f32::from_bits(special_bits(&mut seed) as u32) * [1.0, 0.5, 3.0][i % 3]
            }
        });
        // SAFETY: AVX-512 BF16 is present (checked above).
        let hw = unsafe { x86::avx512bf16::dot_pairs(&acc, &a, &b) };
        for j in 0..16 {
            let (pa, pb) = ([a[2 * j], a[2 * j + 1]], [b[2 * j], b[2 * j + 1]]);
            let want = if held {
                portable(acc[j], pa, pb)
            } else {
                emulated(acc[j], pa, pb)
            };
            if !held && emulated(acc[j], pa, pb).to_bits() != portable(acc[j], pa, pb).to_bits() {
                flushed_cases += 1;
            }
            checked += 1;
            assert!(
                hw[j].to_bits() == want.to_bits() || (hw[j].is_nan() && want.is_nan()),
                "acc {:e} a {pa:04x?} b {pb:04x?}: vdpbf16ps {:e}, definition {want:e}",
                acc[j],
                hw[j]
            );
        }
    }
    // The random inputs did reach the denormal cases the flush exists for.
    assert!(flushed_cases > 100 && checked == 64_000, "{flushed_cases}");
}

#[test]
fn rows_do_not_depend_on_their_neighbours_or_the_thread_count() {
    let mut seed = 5;
    let (n, k) = (41, 72);
    let w = Bf16Matrix::from_bytes(&random_bytes(n, k, &mut seed), n, k).expect("layout");
    check_rows_stand_alone(&w, (n, k), &mut seed);
}

#[test]
fn malformed_layouts_are_refused_and_rows_dequantize_as_candle_does() {
    assert!(Bf16Matrix::from_bytes(&[0; 10], 2, 3).is_none());
    assert!(Bf16Matrix::from_bytes(&[0; 12], 2, 3).is_some());
    assert!(Bf16Matrix::from_bytes(&[], usize::MAX, 3).is_none());
    assert!(Bf16Matrix::from_bytes(&[], 4, 0).is_none());

    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    use candle_core::Device;
    let mut seed = 29;
    let (n, k) = (3, 40);
    let bytes = random_bytes(n, k, &mut seed);
    let w = Bf16Matrix::from_bytes(&bytes, n, k).expect("layout");
    let storage = QStorage::from_data(
        std::borrow::Cow::Borrowed(&bytes),
        &Device::Cpu,
        GgmlDType::BF16,
    )
    .unwrap();
    let want = QTensor::new(storage, (n, k))
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for (j, want) in want.iter().enumerate() {
        let mut row = vec![0f32; k];
        w.dequantize_row(j, &mut row);
        assert!(same_bits(&row, want), "row {j}");
    }
}

/// Throughput per level: `cargo test --release --lib kernels::bf16::tests::throughput --
/// --ignored --nocapture` (`PPL_BENCH_THREADS`, default 2).
#[test]
#[ignore]
fn throughput() {
    let threads = crate::test_util::bench_count("PPL_BENCH_THREADS", 2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let mut seed = 1;
    for &(m, n, k) in &[(512, 8192, 2048), (512, 2048, 8192), (512, 2048, 2048)] {
        let x = random_x(m * k, &mut seed);
        let w = Bf16Matrix::from_bytes(&random_bytes(n, k, &mut seed), n, k).expect("layout");
        let half = super::super::half::HalfMatrix::from_bytes(
            super::super::half::HalfType::Bf16,
            &random_bytes(n, k, &mut seed),
            n,
            k,
        )
        .expect("layout");
        let flops = 2.0 * (m * n * k) as f64;
        let time = |f: &(dyn Fn() + Sync)| {
            pool.install(|| {
                f();
                let t = std::time::Instant::now();
                for _ in 0..3 {
                    f();
                }
                flops / (t.elapsed().as_secs_f64() / 3.0) / 1e9
            })
        };
        let mut line = format!("m={m} [{n} x {k}] {threads} threads GFLOP/s:");
        for isa in levels().into_iter().filter(|&l| l >= Isa::Avx2) {
            let g = time(&|| {
                std::hint::black_box(w.matmul_at(&x, m, isa));
            });
            line += &format!(" {}={g:.1}", isa.name());
        }
        let g = time(&|| {
            std::hint::black_box(half.matmul_at(&x, m, Isa::Avx512));
        });
        println!("{line}; widening kernel {g:.1}");
    }
}
