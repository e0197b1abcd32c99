use super::super::panel::tests::lcg;
use super::*;

fn random_q5_0(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n * k / BLOCK {
        bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.05).to_le_bytes());
        for _ in 0..20 {
            bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
        }
    }
    bytes
}

fn random_q8_0(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for b in 0..n * k / BLOCK {
        bytes.extend_from_slice(&f16::from_f32(lcg(seed) * 0.01).to_le_bytes());
        for e in 0..32 {
            // Include −128, which ggml's quantizer never writes but a file may hold.
            let v = if b % 7 == 0 && e == 3 {
                -128
            } else {
                (lcg(seed) * 127.9) as i8
            };
            bytes.push(v as u8);
        }
    }
    bytes
}

/// Q5_0 by the GGUF definition: `(nibble | high bit << 4) − 16`, times d.
fn q5_0_value(blk: &[u8], e: usize) -> f64 {
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    let nib = if e < 16 {
        blk[6 + e] & 15
    } else {
        blk[6 + e - 16] >> 4
    };
    d * ((nib as i32 | (((qh >> e) & 1) as i32) << 4) - 16) as f64
}

fn q8_0_value(blk: &[u8], e: usize) -> f64 {
    f16::from_le_bytes([blk[0], blk[1]]).to_f64() * (blk[2 + e] as i8) as f64
}

/// A file format's block size and its value `e` of a block, by the GGUF definition.
type Format = (usize, fn(&[u8], usize) -> f64);

/// The file's weights (read from its bytes, not from our layout) times the dequantized Q8_0
/// activations, in f64.
fn naive(
    bytes: &[u8],
    (block_bytes, value): Format,
    (n, k): (usize, usize),
    x: &[f32],
    m: usize,
) -> Vec<f64> {
    let nb = k / BLOCK;
    let a = Panels::quantize(x, m, k);
    let mut out = vec![0f64; m * n];
    for row in 0..m {
        let (p, r) = (a.panel(row / PANEL), row % PANEL);
        for j in 0..n {
            let mut s = 0f64;
            for b in 0..nb {
                let blk = &bytes[(j * nb + b) * block_bytes..][..block_bytes];
                let i = b * PANEL + r;
                for e in 0..32 {
                    s += value(blk, e) * (p.d[i] as f64 * p.qs[i][e] as f64);
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

/// `w`'s product against the f64 reference (relative 10⁻⁴), and every level's bits equal
/// to the portable path's.
fn check(w: &Int8Matrix, want: &[f64], x: &[f32], m: usize) {
    let (n, k) = w.shape();
    let portable = w.matmul_at(x, m, Isa::Portable);
    for (i, (&g, &e)) in portable.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()),
            "({m},{n},{k}) [{i}] {g} vs {e}"
        );
    }
    for isa in levels() {
        assert_eq!(
            bits(&w.matmul_at(x, m, isa)),
            bits(&portable),
            "{isa:?} ({m},{n},{k})"
        );
    }
    assert_eq!(bits(&w.matmul(x, m)), bits(&portable));
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 32),
    (3, 5, 64),
    (7, 33, 96),
    (21, 17, 640),
    (9, 131, 64),
    (16, 3, 2080),
    (8, 16, 32),
    (10, 129, 576),
];

#[test]
fn q5_0_matches_naive_reference_and_every_isa_level_bit_for_bit() {
    let mut seed = 11;
    for &(m, n, k) in SHAPES {
        let bytes = random_q5_0(n, k, &mut seed);
        let w = Int8Matrix::from_q5_0(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let want = naive(&bytes, (Q5_0_BLOCK_BYTES, q5_0_value), (n, k), &x, m);
        check(&w, &want, &x, m);
    }
}

#[test]
fn q8_0_matches_naive_reference_and_every_isa_level_bit_for_bit() {
    let mut seed = 19;
    for &(m, n, k) in SHAPES {
        let bytes = random_q8_0(n, k, &mut seed);
        let w = Int8Matrix::from_q8_0(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let want = naive(&bytes, (Q8_0_BLOCK_BYTES, q8_0_value), (n, k), &x, m);
        check(&w, &want, &x, m);
    }
}

#[test]
fn extreme_blocks_give_the_same_bits_on_every_path() {
    // Every weight −128 or 127 against ±127 activations: the largest products each path forms.
    let (n, k) = (19, 64);
    let mut bytes = Vec::new();
    for b in 0..n * k / BLOCK {
        bytes.extend_from_slice(&f16::from_f32(if b % 2 == 0 { 1.0 } else { -3.5 }).to_le_bytes());
        bytes.extend_from_slice(&[[0x80, 0x7F, 0x80, 0x00][b % 4]; 32]);
    }
    let w = Int8Matrix::from_q8_0(&bytes, n, k).expect("layout");
    let x: Vec<f32> = (0..9 * k)
        .map(|i| if i % 3 == 0 { 100.0 } else { -100.0 })
        .collect();
    let want = naive(&bytes, (Q8_0_BLOCK_BYTES, q8_0_value), (n, k), &x, 9);
    check(&w, &want, &x, 9);
}

#[test]
fn dequantized_rows_equal_candles_dequantization() {
    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    use candle_core::Device;
    let mut seed = 23;
    let (n, k) = (19, 96);
    for (dtype, bytes) in [
        (GgmlDType::Q8_0, random_q8_0(n, k, &mut seed)),
        (GgmlDType::Q5_0, random_q5_0(n, k, &mut seed)),
    ] {
        let w = match dtype {
            GgmlDType::Q8_0 => Int8Matrix::from_q8_0(&bytes, n, k),
            _ => Int8Matrix::from_q5_0(&bytes, n, k),
        }
        .expect("layout");
        // 34 bytes per block, plus the last group's padding rows (13 of 32).
        assert_eq!(w.storage_bytes(), 32 * (k / BLOCK) * Q8_0_BLOCK_BYTES);
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
            assert_eq!(bits(&row), bits(want), "{dtype:?} row {j}");
        }
    }
}

#[test]
fn rows_do_not_depend_on_their_neighbours_or_the_thread_count() {
    let mut seed = 5;
    let (n, k) = (40, 128);
    let w = Int8Matrix::from_q5_0(&random_q5_0(n, k, &mut seed), n, k).expect("layout");
    let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
    let all = w.matmul(&x, 37);
    for r in [0, 5, 16, 36] {
        let one = w.matmul(&x[r * k..(r + 1) * k], 1);
        assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
    }
    let tail = w.matmul(&x[5 * k..], 32);
    assert_eq!(&all[5 * n..], tail.as_slice());
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        assert_eq!(pool.install(|| w.matmul(&x, 37)), all);
    }
}

#[test]
fn decoding_covers_the_extremes_and_refuses_bad_sizes() {
    // qh all ones, nibbles 0xF → +15; qh zero, nibbles 0 → −16.
    let mut b = vec![0u8; Q5_0_BLOCK_BYTES];
    b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    b[2..6].copy_from_slice(&0x0000_FFFFu32.to_le_bytes());
    for v in &mut b[6..] {
        *v = 0x0F;
    }
    let w = Int8Matrix::from_q5_0(&b, 1, 32).expect("layout");
    let mut row = [0f32; 32];
    w.dequantize_row(0, &mut row);
    assert_eq!(
        (&row[..16], &row[16..]),
        (&[15f32; 16][..], &[-16f32; 16][..])
    );
    assert!(Int8Matrix::from_q5_0(&b[..21], 1, 32).is_none());
    let mut q8 = vec![0u8; Q8_0_BLOCK_BYTES];
    q8[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
    q8[2] = 0x80;
    q8[33] = 0x7F;
    let w = Int8Matrix::from_q8_0(&q8, 1, 32).expect("layout");
    w.dequantize_row(0, &mut row);
    assert_eq!((row[0], row[31]), (-128.0, 127.0));
    assert!(Int8Matrix::from_q8_0(&q8, 2, 32).is_none());
    assert!(Int8Matrix::from_q8_0(&q8, 1, 31).is_none());
    assert!(Int8Matrix::from_q8_0(&[], 1, 0).is_none());
}

/// Throughput per level: `cargo test --release --lib kernels::int8::tests::throughput --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let mut seed = 1;
    for &(m, n, k) in &[(512, 8192, 2048), (512, 2048, 8192), (512, 1536, 576)] {
        let w = Int8Matrix::from_q8_0(&random_q8_0(n, k, &mut seed), n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let flops = 2.0 * (m * n * k) as f64;
        let mut line = format!(
            "Q8_0 m={m} [{n} x {k}] {} threads GFLOP/s:",
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
