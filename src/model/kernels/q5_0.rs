//! Q5_0 weights × f32 activations, computed as llama.cpp's CPU backend does: each activation
//! row is quantized to Q8_0 (32-value blocks, scale `d`), and each output is
//! `Σ_blocks d_w·d_a·Σ(q_w·q_a)` with weights in −16..15.
//!
//! Why: Q5_0 is llama.cpp's fallback type for K-quant rows that are not a multiple of 256
//! (Gemma 3's 640-wide rows, SmolLM2's 576 under `--quantize q4_k_m`), and candle's Q5_0 dot
//! product has no SIMD path on x86: Gemma 3 270M Q4_K_M ran at 12.7 tokens/s natively against
//! 154 in f32. The weights are decoded once at load into signed bytes (36 bytes per block
//! instead of 22), so the inner loop is one AVX2 multiply-add of 32 byte pairs.
//!
//! Float order is fixed per output element, as ggml's AVX2 `vec_dot_q5_0_q8_0` orders it:
//! eight lanes, lane `l` accumulating `fma(d_w·d_a, Σ_{i<4} q_w[4l+i]·q_a[4l+i], acc_l)` over
//! the blocks, then `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`. The portable fallback performs
//! the same operations, so results are bit-identical with and without AVX2, for any thread
//! count and any number of rows.

use half::f16;
use rayon::prelude::*;

pub const BLOCK: usize = 32;
/// Bytes of one GGUF Q5_0 block: f16 d, 4 bytes of high bits, 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 22;

/// A Q5_0 weight matrix `[n, k]` (n outputs, k inputs), decoded to signed bytes.
pub struct Q5_0Matrix {
    n: usize,
    k: usize,
    /// Per block: the scale.
    d: Vec<f32>,
    /// Per block: the 32 values, −16..15.
    qs: Vec<[i8; 32]>,
}

/// Activations quantized to Q8_0, row-major blocks.
pub struct Q8_0Rows {
    blocks_per_row: usize,
    d: Vec<f32>,
    qs: Vec<[i8; 32]>,
}

impl Q5_0Matrix {
    /// From GGUF Q5_0 bytes of a `[n, k]` tensor.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if !k.is_multiple_of(BLOCK) || bytes.len() != n * k / BLOCK * BLOCK_BYTES {
            return None;
        }
        let nb = n * k / BLOCK;
        let mut d = Vec::with_capacity(nb);
        let mut qs = Vec::with_capacity(nb);
        for b in bytes.chunks_exact(BLOCK_BYTES) {
            d.push(f16::from_le_bytes([b[0], b[1]]).to_f32());
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let nibbles = &b[6..22];
            let mut q = [0i8; 32];
            for j in 0..16 {
                let lo = (nibbles[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (nibbles[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                q[j] = lo as i8 - 16;
                q[j + 16] = hi as i8 - 16;
            }
            qs.push(q);
        }
        Some(Self { n, k, d, qs })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held.
    pub fn storage_bytes(&self) -> usize {
        self.d.len() * 4 + self.qs.len() * 32
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "activation shape");
        let a = quantize_rows(x, self.k);
        let mut out = vec![0f32; m * self.n];
        // Tasks own disjoint groups of output rows; every element is computed by one call of
        // the kernel, so the split never changes a value.
        const ROWS_PER_TASK: usize = 16;
        out.par_chunks_mut(ROWS_PER_TASK * self.n)
            .enumerate()
            .for_each(|(t, out)| {
                let r0 = t * ROWS_PER_TASK;
                let rows = out.len() / self.n;
                self.rows_into(&a, r0, rows, out);
            });
        out
    }

    fn rows_into(&self, a: &Q8_0Rows, r0: usize, rows: usize, out: &mut [f32]) {
        let nb = self.k / BLOCK;
        let mut r = 0;
        while r < rows {
            let take = (rows - r).min(4);
            for j in 0..self.n {
                let w = j * nb..(j + 1) * nb;
                let mut res = [0f32; 4];
                dot_rows(&self.d[w.clone()], &self.qs[w], a, r0 + r, take, &mut res);
                for i in 0..take {
                    out[(r + i) * self.n + j] = res[i];
                }
            }
            r += take;
        }
    }
}

/// llama.cpp's x86 `quantize_row_q8_0`: `d = amax/127`, values `round_half_even(x·127/amax)`,
/// d stored as f16 (and used as its f32 value).
pub fn quantize_rows(x: &[f32], k: usize) -> Q8_0Rows {
    let nb = k / BLOCK;
    let blocks = x.len() / BLOCK;
    let mut out = Q8_0Rows {
        blocks_per_row: nb,
        d: Vec::with_capacity(blocks),
        qs: Vec::with_capacity(blocks),
    };
    for block in x.chunks_exact(BLOCK) {
        let amax = block.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut q = [0i8; 32];
        for (qi, &v) in q.iter_mut().zip(block) {
            *qi = (v * id).round_ties_even() as i8;
        }
        out.d.push(f16::from_f32(amax / 127.0).to_f32());
        out.qs.push(q);
    }
    out
}

/// Dots of one weight row with `take` (≤ 4) consecutive activation rows.
fn dot_rows(
    wd: &[f32],
    wqs: &[[i8; 32]],
    a: &Q8_0Rows,
    row: usize,
    take: usize,
    res: &mut [f32; 4],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx2_available() {
            // SAFETY: AVX2 and FMA are present (checked above).
            unsafe { avx2::dot_rows(wd, wqs, a, row, take, res) };
            return;
        }
    }
    for (i, r) in res.iter_mut().enumerate().take(take) {
        *r = dot_portable(wd, wqs, a, row + i);
    }
}

/// The same operations as the AVX2 kernel, one lane at a time.
pub(crate) fn dot_portable(wd: &[f32], wqs: &[[i8; 32]], a: &Q8_0Rows, row: usize) -> f32 {
    let nb = a.blocks_per_row;
    let base = row * nb;
    let mut acc = [0f32; 8];
    for b in 0..nb {
        let (qw, qa) = (&wqs[b], &a.qs[base + b]);
        let d = wd[b] * a.d[base + b];
        for (l, acc_l) in acc.iter_mut().enumerate() {
            let xy: i32 = (4 * l..4 * l + 4)
                .map(|e| qw[e] as i32 * qa[e] as i32)
                .sum();
            *acc_l = d.mul_add(xy as f32, *acc_l);
        }
    }
    let r: [f32; 4] = std::array::from_fn(|i| acc[i + 4] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Q8_0Rows;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rows(
        wd: &[f32],
        wqs: &[[i8; 32]],
        a: &Q8_0Rows,
        row: usize,
        take: usize,
        res: &mut [f32; 4],
    ) {
        let nb = a.blocks_per_row;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            let qw = _mm256_loadu_si256(wqs[b].as_ptr() as *const __m256i);
            // maddubs multiplies unsigned by signed bytes: |w| times a with w's sign.
            let aw = _mm256_sign_epi8(qw, qw);
            for (i, acc_i) in acc.iter_mut().enumerate().take(take) {
                let ab = (row + i) * nb + b;
                let qa = _mm256_loadu_si256(a.qs[ab].as_ptr() as *const __m256i);
                let sa = _mm256_sign_epi8(qa, qw);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones);
                let d = _mm256_set1_ps(wd[b] * a.d[ab]);
                *acc_i = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), *acc_i);
            }
        }
        for (r, acc_i) in res.iter_mut().zip(&acc).take(take) {
            *r = super::super::hsum256(*acc_i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

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

    /// Dequantized by the GGUF definition (`(nibble | high bit << 4) − 16`, times d), times
    /// the dequantized Q8_0 activations, in f64.
    fn naive(bytes: &[u8], n: usize, k: usize, a: &Q8_0Rows, m: usize) -> Vec<f64> {
        let nb = k / BLOCK;
        let mut out = vec![0f64; m * n];
        for r in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for b in 0..nb {
                    let blk = &bytes[(j * nb + b) * BLOCK_BYTES..][..BLOCK_BYTES];
                    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f64();
                    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    let ab = r * nb + b;
                    for e in 0..32 {
                        let nib = if e < 16 {
                            blk[6 + e] & 15
                        } else {
                            blk[6 + e - 16] >> 4
                        };
                        let w = (nib as i32 | (((qh >> e) & 1) as i32) << 4) - 16;
                        s += (d * w as f64) * (a.d[ab] as f64 * a.qs[ab][e] as f64);
                    }
                }
                out[r * n + j] = s;
            }
        }
        out
    }

    #[test]
    fn matches_naive_reference_and_portable_path_bit_for_bit() {
        let mut seed = 11;
        for &(m, n, k) in &[(1, 1, 32), (3, 5, 64), (7, 33, 96), (21, 17, 640)] {
            let bytes = random_q5_0(n, k, &mut seed);
            let w = Q5_0Matrix::from_bytes(&bytes, n, k).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let got = w.matmul(&x, m);
            let a = quantize_rows(&x, k);
            let want = naive(&bytes, n, k, &a, m);
            let nb = k / BLOCK;
            for r in 0..m {
                for j in 0..n {
                    let (g, e) = (got[r * n + j] as f64, want[r * n + j]);
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "({m},{n},{k}) [{r},{j}] {g} vs {e}"
                    );
                    let portable = dot_portable(
                        &w.d[j * nb..(j + 1) * nb],
                        &w.qs[j * nb..(j + 1) * nb],
                        &a,
                        r,
                    );
                    assert_eq!(got[r * n + j].to_bits(), portable.to_bits());
                }
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_their_neighbours() {
        let mut seed = 5;
        let (n, k) = (40, 128);
        let w = Q5_0Matrix::from_bytes(&random_q5_0(n, k, &mut seed), n, k).unwrap();
        let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
        let all = w.matmul(&x, 37);
        for r in [0, 5, 16, 36] {
            let one = w.matmul(&x[r * k..(r + 1) * k], 1);
            assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
        }
    }

    #[test]
    fn decoding_covers_the_extremes() {
        // qh all ones, nibbles 0xF → +15; qh zero, nibbles 0 → −16.
        let mut b = vec![0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2..6].copy_from_slice(&0x0000_FFFFu32.to_le_bytes());
        for v in &mut b[6..] {
            *v = 0x0F;
        }
        let w = Q5_0Matrix::from_bytes(&b, 1, 32).unwrap();
        assert_eq!(&w.qs[0][..16], &[15i8; 16]);
        assert_eq!(&w.qs[0][16..], &[-16i8; 16]);
        assert!(Q5_0Matrix::from_bytes(&b[..21], 1, 32).is_none());
    }
}
