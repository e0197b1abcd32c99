use super::super::panel::tests::lcg;
use super::*;

fn random_q4_0(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n * k / BLOCK {
        bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.05).to_le_bytes());
        for _ in 0..16 {
            bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
        }
    }
    bytes
}

/// The file's weights (read from its bytes, not from our layout) times the dequantized Q8_0
/// activations, in f64.
fn naive(bytes: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f64> {
    let nb = k / BLOCK;
    let a = Panels::quantize(x, m, k);
    let mut out = vec![0f64; m * n];
    for row in 0..m {
        let (p, r) = (a.panel(row / PANEL), row % PANEL);
        for j in 0..n {
            let mut s = 0f64;
            for b in 0..nb {
                let block = &bytes[(j * nb + b) * BLOCK_BYTES..][..BLOCK_BYTES];
                let d = f16::from_le_bytes([block[0], block[1]]).to_f64();
                let i = b * PANEL + r;
                for e in 0..32 {
                    let byte = block[2 + e % 16];
                    let nibble = if e < 16 { byte & 0x0F } else { byte >> 4 };
                    let w = (nibble as i32 - 8) as f64 * d;
                    s += w * (p.d[i] as f64 * p.qs[i][e] as f64);
                }
            }
            out[row * n + j] = s;
        }
    }
    out
}

fn levels() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&l| l <= super::super::isa())
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn matches_naive_reference_and_every_path_gives_the_same_bits() {
    let mut seed = 13;
    for &(m, n, k) in &[
        (1, 1, 32),
        (3, 5, 64),
        (7, 33, 96),
        (21, 17, 576),
        (9, 130, 64),
        (16, 3, 2080),
        (8, 16, 32),
    ] {
        let bytes = random_q4_0(n, k, &mut seed);
        let w = Q4_0Matrix::from_bytes(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let want = naive(&bytes, n, k, &x, m);
        let portable = w.matmul_at(&x, m, Isa::Portable);
        for (i, (&g, &e)) in portable.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()),
                "({m},{n},{k}) [{i}] {g} vs {e}"
            );
        }
        for isa in levels() {
            assert_eq!(
                bits(&w.matmul_at(&x, m, isa)),
                bits(&portable),
                "{isa:?} ({m},{n},{k})"
            );
        }
        assert_eq!(bits(&w.matmul(&x, m)), bits(&portable));
    }
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every weight −8 or 7 (the extremes) against ±127 activations.
    let (n, k) = (19, 64);
    let mut bytes = Vec::new();
    for b in 0..n * k / BLOCK {
        bytes.extend_from_slice(&f16::from_f32(if b % 2 == 0 { 1.0 } else { -3.5 }).to_le_bytes());
        bytes.extend_from_slice(&[[0x00, 0xF0, 0xFF, 0x0F][b % 4]; 16]);
    }
    let w = Q4_0Matrix::from_bytes(&bytes, n, k).expect("layout");
    let x: Vec<f32> = (0..9 * k)
        .map(|i| if i % 3 == 0 { 100.0 } else { -100.0 })
        .collect();
    let want = naive(&bytes, n, k, &x, 9);
    let portable = w.matmul_at(&x, 9, Isa::Portable);
    for (&g, &e) in portable.iter().zip(&want) {
        assert!((g as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
    }
    for isa in levels() {
        assert_eq!(bits(&w.matmul_at(&x, 9, isa)), bits(&portable), "{isa:?}");
    }
}

#[test]
fn dequantized_rows_equal_candles_dequantization() {
    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    use candle_core::Device;
    let mut seed = 31;
    let (n, k) = (19, 96);
    let bytes = random_q4_0(n, k, &mut seed);
    let w = Q4_0Matrix::from_bytes(&bytes, n, k).expect("layout");
    // The file's bytes, plus the last group's padding rows (13 of 32).
    assert_eq!(w.storage_bytes(), bytes.len() / n * 32);
    let storage = QStorage::from_data(
        std::borrow::Cow::Borrowed(&bytes),
        &Device::Cpu,
        GgmlDType::Q4_0,
    )
    .unwrap();
    let q = QTensor::new(storage, (n, k)).unwrap();
    let want = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for (j, want) in want.iter().enumerate() {
        let mut row = vec![0f32; k];
        w.dequantize_row(j, &mut row);
        assert_eq!(bits(&row), bits(want), "row {j}");
    }
}

#[test]
fn rows_do_not_depend_on_their_neighbours_or_the_thread_count() {
    let mut seed = 3;
    let (n, k) = (40, 128);
    let w = Q4_0Matrix::from_bytes(&random_q4_0(n, k, &mut seed), n, k).expect("layout");
    let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
    let all = w.matmul(&x, 37);
    for r in [0, 5, 16, 36] {
        let one = w.matmul(&x[r * k..(r + 1) * k], 1);
        assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
    }
    let tail = w.matmul(&x[3 * k..], 34);
    assert_eq!(&all[3 * n..], tail.as_slice());
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        assert_eq!(pool.install(|| w.matmul(&x, 37)), all);
    }
    assert!(Q4_0Matrix::from_bytes(&[0; 17], 1, 32).is_none());
    assert!(Q4_0Matrix::from_bytes(&[0; 18], 1, 31).is_none());
    assert!(Q4_0Matrix::from_bytes(&[], 1, 0).is_none());
}

/// Throughput per level: `cargo test --release --lib kernels::q4_0::tests::throughput --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let mut seed = 1;
    for &(m, n, k) in &[(512, 8192, 2048), (512, 2048, 8192), (512, 1536, 576)] {
        let w = Q4_0Matrix::from_bytes(&random_q4_0(n, k, &mut seed), n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let flops = 2.0 * (m * n * k) as f64;
        let mut line = format!(
            "Q4_0 m={m} [{n} x {k}] {} threads GFLOP/s:",
            rayon::current_num_threads()
        );
        for isa in levels().into_iter().filter(|&l| l >= Isa::Avx2) {
            w.matmul_at(&x, m, isa);
            let t = std::time::Instant::now();
            for _ in 0..3 {
                std::hint::black_box(w.matmul_at(&x, m, isa));
            }
            line += &format!(
                " {}={:.1}",
                isa.name(),
                flops / (t.elapsed().as_secs_f64() / 3.0) / 1e9
            );
        }
        println!("{line}");
    }
}
