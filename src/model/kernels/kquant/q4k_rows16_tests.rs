use super::super::super::panel::tests::lcg;
use super::super::q4k::Q4KMatrix;
use super::super::tests::{random_byte, random_f16};
use super::*;

/// Random super-blocks: finite positive d and dmin, random packed scales, mins and values.
fn random_q4k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n * k / QK_K {
        bytes.extend_from_slice(&random_f16(seed, 0.01));
        bytes.extend_from_slice(&random_f16(seed, 0.002));
        for _ in 4..144 {
            bytes.push(random_byte(seed));
        }
    }
    bytes
}

/// Value `e` of a super-block by the GGUF definition (from the file's bytes), in f64.
fn reference(blk: &[u8], e: usize) -> f64 {
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
    let dmin = f16::from_le_bytes([blk[2], blk[3]]).to_f64();
    let s = e / 32;
    let sc = &blk[4..16];
    let (scale, min) = if s < 4 {
        (sc[s] & 63, sc[s + 4] & 63)
    } else {
        (
            (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4),
            (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4),
        )
    };
    let byte = blk[16 + 32 * (e / 64) + e % 32];
    let q = if (e / 32).is_multiple_of(2) {
        byte & 15
    } else {
        byte >> 4
    };
    d * scale as f64 * q as f64 - dmin * min as f64
}

/// The file's weights times the dequantized Q8_K activations, in f64, and the sum of the
/// terms' magnitudes (the scale of the rounding error).
fn naive(bytes: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Vec<(f64, f64)> {
    let nb = k / QK_K;
    let a = Q8KPanels::quantize(x, m, k);
    let mut out = vec![(0f64, 0f64); m * n];
    for row in 0..m {
        let (p, r) = (a.panel(row / PANEL), row % PANEL);
        for j in 0..n {
            let (mut want, mut size) = (0f64, 0f64);
            for b in 0..nb {
                let blk = &bytes[(j * nb + b) * 144..][..144];
                let i = b * PANEL + r;
                for e in 0..QK_K {
                    let term = reference(blk, e) * (p.d[i] as f64 * p.qs[i][e] as f64);
                    want += term;
                    size += term.abs();
                }
            }
            out[row * n + j] = (want, size);
        }
    }
    out
}

fn levels() -> Vec<Isa> {
    [Isa::Portable, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&l| l <= super::super::super::isa())
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Rows not a multiple of the group or the panel, one to nine super-blocks per row.
const SHAPES: [(usize, usize, usize); 7] = [
    (1, 5, 256),
    (7, 9, 512),
    (8, 3, 2304),
    (9, 130, 256),
    (17, 33, 512),
    (2, 1, 2304),
    (16, 16, 768),
];

#[test]
fn matches_naive_reference_and_every_path_gives_the_same_bits_as_before_repacking() {
    let mut seed = 31;
    for (m, n, k) in SHAPES {
        let bytes = random_q4k(n, k, &mut seed);
        let w = Q4KRows16::from_bytes(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
        let portable = w.matmul_at(&x, m, Isa::Portable);
        for (i, (&g, &(want, size))) in portable.iter().zip(&naive(&bytes, n, k, &x, m)).enumerate()
        {
            assert!(
                (g as f64 - want).abs() <= 1e-5 * size + 1e-30,
                "({m},{n},{k}) [{i}] {g} vs {want} (size {size})"
            );
        }
        // The float order of the unrepacked panel kernel: the same bits as before.
        let before = Q4KMatrix::from_bytes(&bytes, n, k).expect("layout");
        assert_eq!(
            bits(&before.matmul_with(&x, m, Isa::Portable)),
            bits(&portable),
            "({m},{n},{k}) vs the panel kernel"
        );
        for isa in levels() {
            assert_eq!(
                bits(&w.matmul_at(&x, m, isa)),
                bits(&portable),
                "{isa:?} ({m},{n},{k})"
            );
        }
    }
}

#[test]
fn rows_do_not_depend_on_their_neighbours() {
    let mut seed = 5;
    let (n, k) = (40, 512);
    let w = Q4KRows16::from_bytes(&random_q4k(n, k, &mut seed), n, k).expect("layout");
    let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
    let all = w.matmul(&x, 37);
    for r in [0, 5, 16, 36] {
        let one = w.matmul(&x[r * k..(r + 1) * k], 1);
        assert_eq!(bits(&all[r * n..(r + 1) * n]), bits(&one));
    }
    let tail = w.matmul(&x[3 * k..], 34);
    assert_eq!(bits(&all[3 * n..]), bits(&tail));
}

#[test]
fn dequantized_rows_equal_the_file_layouts() {
    let mut seed = 23;
    let (n, k) = (19, 512);
    let bytes = random_q4k(n, k, &mut seed);
    let w = Q4KRows16::from_bytes(&bytes, n, k).expect("layout");
    let before = Q4KMatrix::from_bytes(&bytes, n, k).expect("layout");
    for j in 0..n {
        let (mut got, mut want) = (vec![0f32; k], vec![0f32; k]);
        w.dequantize_row(j, &mut got);
        before.dequantize_row(j, &mut want);
        assert_eq!(bits(&got), bits(&want), "row {j}");
    }
}

#[test]
fn memory_is_the_unpacked_blocks_and_malformed_shapes_are_refused() {
    let bytes = vec![0u8; 16 * 2 * 144];
    let w = Q4KRows16::from_bytes(&bytes, 16, 512).expect("layout");
    assert_eq!(w.storage_bytes(), 16 * 2 * 148);
    // 17 rows: one group of padding.
    let w = Q4KRows16::from_bytes(&vec![0u8; 17 * 144], 17, 256).expect("layout");
    assert_eq!(w.storage_bytes(), 32 * 148);
    assert!(Q4KRows16::from_bytes(&bytes, 16, 500).is_none());
    assert!(Q4KRows16::from_bytes(&bytes[1..], 16, 512).is_none());
    assert!(Q4KRows16::from_bytes(&[], 0, 0).is_none());
}
