use super::super::half_driver::tests::{
    check_levels, check_rows_stand_alone, naive as naive_products, random_x, same_bits, SHAPES,
};
use super::super::panel::tests::lcg;
use super::*;

/// Random weights spread over several binades, as file bytes.
fn random_bytes(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    (0..n * k)
        .flat_map(|_| (lcg(seed) * 2f32.powi((lcg(seed) * 6.0) as i32)).to_le_bytes())
        .collect()
}

super::super::half_driver::tests::product_of!(F32Matrix);

/// The products in f64, and the sum of their magnitudes.
fn naive(w: &F32Matrix, x: &[f32]) -> Vec<(f64, f64)> {
    let k = w.k;
    naive_products(
        w.shape(),
        x,
        |j, e| w.values.get()[j * k + e] as f64,
        |x| x as f64,
    )
}

/// The definition written out for one output: lane sums by fused multiply-adds, ggml's
/// `hsum_float_8`, then the tail one product at a time.
fn definition(w: &[f32], x: &[f32]) -> f32 {
    let chunks = w.len() / LANES;
    let mut lanes = [0f32; LANES];
    for c in 0..chunks {
        for (l, a) in lanes.iter_mut().enumerate() {
            *a = w[c * LANES + l].mul_add(x[c * LANES + l], *a);
        }
    }
    let sum = super::super::panel::hsum8(&lanes);
    w[chunks * LANES..]
        .iter()
        .zip(&x[chunks * LANES..])
        .fold(sum, |s, (&w, &x)| w.mul_add(x, s))
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
    for &(m, n, k) in &SHAPES {
        let w = F32Matrix::from_bytes(&random_bytes(n, k, &mut seed), n, k).expect("layout");
        let x = random_x(m * k, &mut seed);
        let what = format!("({m},{n},{k})");
        let portable = check_levels(&w, (&x, m), &naive(&w, &x), &levels(), &what);
        // The portable path is the definition, output by output.
        for (i, &g) in portable.iter().enumerate() {
            let (row, j) = (i / n, i % n);
            let d = definition(&w.values.get()[j * k..][..k], &x[row * k..][..k]);
            assert_eq!(g.to_bits(), d.to_bits(), "{what} [{i}]");
        }
    }
}

#[test]
fn zeros_denormals_and_infinities_give_the_same_bits_on_every_path() {
    let mut seed = 41;
    let (m, n, k) = (11, 14, 45);
    let special = |seed: &mut u64| match (lcg(seed).abs() * 8.0) as u32 {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits(1 + (lcg(seed).abs() * 1000.0) as u32),
        3 => 1e-38 * lcg(seed),
        4 => 1e30 * lcg(seed),
        _ => lcg(seed),
    };
    let bytes: Vec<u8> = (0..n * k)
        .flat_map(|_| special(&mut seed).to_le_bytes())
        .collect();
    let w = F32Matrix::from_bytes(&bytes, n, k).expect("layout");
    let x: Vec<f32> = (0..m * k).map(|_| special(&mut seed)).collect();
    let portable = w.matmul_at(&x, m, Isa::Portable);
    for isa in levels() {
        assert!(same_bits(&w.matmul_at(&x, m, isa), &portable), "{isa:?}");
    }
    // Denormal products survive (no flush to zero on any path).
    let tiny =
        F32Matrix::from_bytes(&f32::from_bits(8).to_le_bytes().repeat(16), 2, 8).expect("layout");
    for isa in levels() {
        let y = tiny.matmul_at(&[0.5; 8], 1, isa);
        assert_eq!(y, vec![f32::from_bits(32), f32::from_bits(32)], "{isa:?}");
    }
}

#[test]
fn weights_in_the_file_map_are_used_in_place_with_the_same_bits() {
    use crate::model::mapped::{tests::map_of, MappedBytes};
    let mut seed = 9;
    let (m, n, k) = (10, 27, 52);
    let bytes = random_bytes(n, k, &mut seed);
    let x = random_x(m * k, &mut seed);
    let want = F32Matrix::from_bytes(&bytes, n, k)
        .expect("layout")
        .matmul_at(&x, m, Isa::Portable);
    let mut file = vec![0u8; 32];
    file.extend(&bytes);
    let mapped = MappedBytes::new(map_of(&file), 32, bytes.len()).expect("inside");
    let in_place = F32Matrix::from_mapped(&mapped, n, k).expect("layout");
    assert!(in_place.is_in_place() && mapped.is_kept());
    assert_eq!(in_place.storage_bytes(), n * k * 4);
    for isa in levels() {
        assert!(same_bits(&in_place.matmul_at(&x, m, isa), &want), "{isa:?}");
    }
    // A misaligned tensor is copied instead, with the same results.
    let mut odd = vec![0u8; 33];
    odd.extend(&bytes);
    let mapped = MappedBytes::new(map_of(&odd), 33, bytes.len()).expect("inside");
    let copy = F32Matrix::from_mapped(&mapped, n, k).expect("layout");
    assert!(!copy.is_in_place() && !mapped.is_kept());
    assert!(same_bits(&copy.matmul_at(&x, m, Isa::Portable), &want));
    // A wrong length is refused.
    let mapped = MappedBytes::new(map_of(&file), 32, bytes.len() - 4).expect("inside");
    assert!(F32Matrix::from_mapped(&mapped, n, k).is_none());
}

#[test]
fn rows_do_not_depend_on_their_neighbours_or_the_thread_count() {
    let mut seed = 5;
    let (n, k) = (41, 72);
    let w = F32Matrix::from_bytes(&random_bytes(n, k, &mut seed), n, k).expect("layout");
    check_rows_stand_alone(&w, (n, k), &mut seed);
}

#[test]
fn malformed_layouts_are_refused_and_rows_are_the_stored_values() {
    assert!(F32Matrix::from_bytes(&[0; 20], 2, 3).is_none());
    assert!(F32Matrix::from_bytes(&[0; 24], 2, 3).is_some());
    assert!(F32Matrix::from_bytes(&[], usize::MAX, 3).is_none());
    assert!(F32Matrix::from_bytes(&[], 4, 0).is_none());
    let mut seed = 29;
    let (n, k) = (3, 40);
    let bytes = random_bytes(n, k, &mut seed);
    let w = F32Matrix::from_bytes(&bytes, n, k).expect("layout");
    for j in 0..n {
        let mut row = vec![0f32; k];
        w.dequantize_row(j, &mut row);
        let want: Vec<f32> = bytes[j * k * 4..(j + 1) * k * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert!(same_bits(&row, &want), "row {j}");
    }
}

/// Throughput per level: `cargo test --release --lib kernels::f32_weights::tests::throughput
/// -- --ignored --nocapture` (`PPL_BENCH_THREADS`, default 2; `PPL_BENCH_REPS` timed runs per
/// figure, the fastest reported, default 5, since a noisy machine only slows runs down;
/// `PPL_BENCH_SHAPES`, e.g. `512x49152x576,512x1536x576` for `m x n x k`, default SmolLM2's
/// layer shapes).
#[test]
#[ignore]
fn throughput() {
    let threads = crate::test_util::bench_count("PPL_BENCH_THREADS", 2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let reps = crate::test_util::bench_count("PPL_BENCH_REPS", 5);
    let shapes: Vec<(usize, usize, usize)> = match std::env::var("PPL_BENCH_SHAPES") {
        Ok(list) => list
            .split(',')
            .map(|shape| {
                let v: Vec<usize> = shape.split('x').filter_map(|x| x.parse().ok()).collect();
                assert!(v.len() == 3, "PPL_BENCH_SHAPES: '{shape}' is not m x n x k");
                (v[0], v[1], v[2])
            })
            .collect(),
        Err(_) => vec![(512, 1536, 576), (512, 576, 1536), (512, 576, 576)],
    };
    let mut seed = 1;
    for &(m, n, k) in &shapes {
        let x = random_x(m * k, &mut seed);
        let w = F32Matrix::from_bytes(&random_bytes(n, k, &mut seed), n, k).expect("layout");
        let flops = 2.0 * (m * n * k) as f64;
        let time = |f: &(dyn Fn() + Sync)| {
            pool.install(|| {
                f();
                let fastest = (0..reps)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        f();
                        t.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min);
                flops / fastest / 1e9
            })
        };
        let mut line = format!("m={m} [{n} x {k}] {threads} threads GFLOP/s:");
        for isa in levels().into_iter().filter(|&l| l >= Isa::Avx2) {
            let g = time(&|| {
                std::hint::black_box(w.matmul_at(&x, m, isa));
            });
            line += &format!(" {}={g:.1}", isa.name());
        }
        let xt =
            candle_core::Tensor::from_vec(x.clone(), (m, k), &candle_core::Device::Cpu).expect("x");
        let wt = candle_core::Tensor::from_vec(
            w.values.get().to_vec(),
            (n, k),
            &candle_core::Device::Cpu,
        )
        .expect("w");
        let g = time(&|| {
            std::hint::black_box(xt.matmul(&wt.t().expect("t")).expect("matmul"));
        });
        println!("{line}; candle gemm {g:.1}");
    }
}
