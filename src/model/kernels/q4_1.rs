//! Q4_1 weights × f32 activations, computed as llama.cpp's CPU backend does: each activation
//! row is quantized to Q8_1 (32-value blocks, scale `d`, `s = d·Σq`), and each output is
//! `Σ_blocks d_w·d_a·Σ(q_w·q_a) + Σ_blocks m_w·s_a`.
//!
//! Float order is fixed per output element and mirrors ggml's AVX2 `vec_dot_q4_1_q8_1`: eight
//! lanes, lane `l` accumulating `fma(d_w·d_a, Σ_{i<4} q_w[4l+i]·q_a[4l+i], acc_l)` over the
//! blocks, then `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, then the `m·s` terms summed in block
//! order. The portable fallback performs the same operations, so results are bit-identical
//! with and without AVX2, for any thread count and any number of rows.

use half::f16;
use rayon::prelude::*;

pub const BLOCK: usize = 32;
/// Bytes of one GGUF Q4_1 block: f16 d, f16 m, 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 20;

/// A Q4_1 weight matrix `[n, k]` (n outputs, k inputs), scales pre-decoded to f32.
pub struct Q4_1Matrix {
    n: usize,
    k: usize,
    /// Per block: (d, m).
    dm: Vec<[f32; 2]>,
    /// Per block: 16 bytes; element i < 16 is the low nibble of byte i, element 16+i the high.
    qs: Vec<[u8; 16]>,
}

/// Activations quantized to Q8_1, row-major blocks.
pub struct Q8_1Rows {
    blocks_per_row: usize,
    d: Vec<f32>,
    s: Vec<f32>,
    qs: Vec<[i8; 32]>,
}

impl Q4_1Matrix {
    /// From GGUF Q4_1 bytes of a `[n, k]` tensor.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if !k.is_multiple_of(BLOCK) || bytes.len() != n * k / BLOCK * BLOCK_BYTES {
            return None;
        }
        let nb = n * k / BLOCK;
        let mut dm = Vec::with_capacity(nb);
        let mut qs = Vec::with_capacity(nb);
        for b in bytes.chunks_exact(BLOCK_BYTES) {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
            dm.push([d, m]);
            qs.push(b[4..20].try_into().expect("16 bytes"));
        }
        Some(Self { n, k, dm, qs })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held.
    pub fn storage_bytes(&self) -> usize {
        self.dm.len() * 8 + self.qs.len() * 16
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "activation shape");
        let a = quantize_rows(x, m, self.k);
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

    fn rows_into(&self, a: &Q8_1Rows, r0: usize, rows: usize, out: &mut [f32]) {
        let nb = self.k / BLOCK;
        let mut r = 0;
        while r < rows {
            let take = (rows - r).min(4);
            for j in 0..self.n {
                let w = j * nb..(j + 1) * nb;
                let (wdm, wqs) = (&self.dm[w.clone()], &self.qs[w]);
                let mut res = [0f32; 4];
                dot_rows(wdm, wqs, a, r0 + r, take, &mut res);
                for i in 0..take {
                    out[(r + i) * self.n + j] = res[i];
                }
            }
            r += take;
        }
    }
}

/// llama.cpp's x86 `quantize_row_q8_1`: `d = amax/127`, values `round_half_even(x·127/amax)`,
/// `s = d·Σq`; d and s stored as f16 (and used as their f32 values).
pub fn quantize_rows(x: &[f32], m: usize, k: usize) -> Q8_1Rows {
    let nb = k / BLOCK;
    let mut out = Q8_1Rows {
        blocks_per_row: nb,
        d: Vec::with_capacity(m * nb),
        s: Vec::with_capacity(m * nb),
        qs: Vec::with_capacity(m * nb),
    };
    for block in x.chunks_exact(BLOCK) {
        let amax = block.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut q = [0i8; 32];
        let mut sum = 0i32;
        for (qi, &v) in q.iter_mut().zip(block) {
            *qi = (v * id).round_ties_even() as i8;
            sum += *qi as i32;
        }
        out.d.push(f16::from_f32(d).to_f32());
        out.s.push(f16::from_f32(d * sum as f32).to_f32());
        out.qs.push(q);
    }
    out
}

/// Dots of one weight column with `take` (≤ 4) consecutive activation rows.
fn dot_rows(
    wdm: &[[f32; 2]],
    wqs: &[[u8; 16]],
    a: &Q8_1Rows,
    row: usize,
    take: usize,
    res: &mut [f32; 4],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx2_available() {
            // SAFETY: AVX2 and FMA are present (checked above).
            unsafe { avx2::dot_rows(wdm, wqs, a, row, take, res) };
            return;
        }
    }
    for (i, r) in res.iter_mut().enumerate().take(take) {
        *r = dot_portable(wdm, wqs, a, row + i);
    }
}

/// The same operations as the AVX2 kernel, one lane at a time.
pub(crate) fn dot_portable(wdm: &[[f32; 2]], wqs: &[[u8; 16]], a: &Q8_1Rows, row: usize) -> f32 {
    let nb = a.blocks_per_row;
    let base = row * nb;
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for b in 0..nb {
        let [dw, mw] = wdm[b];
        let (da, sa, qa) = (a.d[base + b], a.s[base + b], &a.qs[base + b]);
        summs += mw * sa;
        let d = dw * da;
        let q = &wqs[b];
        for (l, acc_l) in acc.iter_mut().enumerate() {
            let mut xy = 0i32;
            for e in 4 * l..4 * l + 4 {
                let w = if e < 16 { q[e] & 0x0F } else { q[e - 16] >> 4 } as i32;
                xy += w * qa[e] as i32;
            }
            *acc_l = d.mul_add(xy as f32, *acc_l);
        }
    }
    let r: [f32; 4] = std::array::from_fn(|i| acc[i + 4] + acc[i]);
    ((r[0] + r[2]) + (r[1] + r[3])) + summs
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Q8_1Rows;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rows(
        wdm: &[[f32; 2]],
        wqs: &[[u8; 16]],
        a: &Q8_1Rows,
        row: usize,
        take: usize,
        res: &mut [f32; 4],
    ) {
        let nb = a.blocks_per_row;
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut summs = [0f32; 4];
        for b in 0..nb {
            let [dw, mw] = wdm[b];
            let raw = _mm_loadu_si128(wqs[b].as_ptr() as *const __m128i);
            // Low nibbles → bytes 0..16, high nibbles → bytes 16..32.
            let both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
            let qw = _mm256_and_si256(both, low);
            for i in 0..take {
                let ab = (row + i) * nb + b;
                summs[i] += mw * a.s[ab];
                let qa = _mm256_loadu_si256(a.qs[ab].as_ptr() as *const __m256i);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(qw, qa), ones);
                let d = _mm256_set1_ps(dw * a.d[ab]);
                acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc[i]);
            }
        }
        for i in 0..take {
            res[i] = super::super::hsum256(acc[i]) + summs[i];
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

    fn random_q4_1(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..n * k / BLOCK {
            bytes.extend_from_slice(&f16::from_f32(lcg(seed).abs() * 0.05 + 0.001).to_le_bytes());
            bytes.extend_from_slice(&f16::from_f32(-lcg(seed).abs() * 0.4).to_le_bytes());
            for _ in 0..16 {
                bytes.push(((lcg(seed) + 1.0) * 127.9) as u8);
            }
        }
        bytes
    }

    /// Dequantized weights times the dequantized Q8_1 activations, in f64.
    fn naive(wm: &Q4_1Matrix, a: &Q8_1Rows, m: usize) -> Vec<f64> {
        let nb = wm.k / BLOCK;
        let mut out = vec![0f64; m * wm.n];
        for r in 0..m {
            for j in 0..wm.n {
                let mut s = 0f64;
                for b in 0..nb {
                    let [d, mn] = wm.dm[j * nb + b];
                    let q = &wm.qs[j * nb + b];
                    let ab = r * nb + b;
                    for e in 0..32 {
                        let w = if e < 16 { q[e] & 15 } else { q[e - 16] >> 4 } as f64;
                        s += (d as f64 * w) * (a.d[ab] as f64 * a.qs[ab][e] as f64);
                    }
                    s += mn as f64 * a.s[ab] as f64;
                }
                out[r * wm.n + j] = s;
            }
        }
        out
    }

    #[test]
    fn matches_naive_reference_and_portable_path_bit_for_bit() {
        let mut seed = 7;
        for &(m, n, k) in &[(1, 1, 32), (3, 5, 64), (7, 33, 96), (21, 17, 576)] {
            let w = Q4_1Matrix::from_bytes(&random_q4_1(n, k, &mut seed), n, k).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let got = w.matmul(&x, m);
            let a = quantize_rows(&x, m, k);
            let want = naive(&w, &a, m);
            for r in 0..m {
                for j in 0..n {
                    let (g, e) = (got[r * n + j] as f64, want[r * n + j]);
                    assert!(
                        (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "({m},{n},{k}) [{r},{j}] {g} vs {e}"
                    );
                    assert_eq!(
                        got[r * n + j].to_bits(),
                        dot_portable(
                            &w.dm[j * (k / 32)..(j + 1) * (k / 32)],
                            &w.qs[j * (k / 32)..(j + 1) * (k / 32)],
                            &a,
                            r
                        )
                        .to_bits()
                    );
                }
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_their_neighbours() {
        let mut seed = 3;
        let (n, k) = (40, 128);
        let w = Q4_1Matrix::from_bytes(&random_q4_1(n, k, &mut seed), n, k).unwrap();
        let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
        let all = w.matmul(&x, 37);
        for r in [0, 5, 16, 36] {
            let one = w.matmul(&x[r * k..(r + 1) * k], 1);
            assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
        }
    }

    #[test]
    fn q8_1_quantization_follows_llama_cpp() {
        let mut x = vec![0f32; 32];
        x[0] = 127.0; // amax: d = 1, id = 1
        x[1] = -2.5; // ties go to even (roundf would give -3)
        x[2] = 3.5;
        x[3] = 0.49;
        let a = quantize_rows(&x, 1, 32);
        assert_eq!(&a.qs[0][..4], &[127, -2, 4, 0]);
        assert_eq!(a.d[0], 1.0);
        assert_eq!(a.s[0], 129.0);
        let zero = quantize_rows(&[0f32; 32], 1, 32);
        assert_eq!((zero.d[0], zero.s[0], zero.qs[0]), (0.0, 0.0, [0i8; 32]));
    }
}
