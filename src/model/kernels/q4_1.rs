//! Q4_1 weights × f32 activations, computed as llama.cpp's CPU backend does: each activation
//! row is quantized to Q8_1 (32-value blocks, scale `d`, `s = d·Σq`), and each output is
//! `Σ_blocks d_w·d_a·Σ(q_w·q_a) + Σ_blocks m_w·s_a`.
//!
//! Float order is fixed per output element and mirrors ggml's AVX2 `vec_dot_q4_1_q8_1`: eight
//! lanes, lane `l` accumulating `fma(d_w·d_a, Σ_{i<4} q_w[4l+i]·q_a[4l+i], acc_l)` over the
//! blocks, then `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, then the `m·s` terms summed in block
//! order. The AVX-512 path (VNNI, two panel rows per register) and the portable fallback
//! perform the same operations per lane, so results are bit-identical at every
//! instruction-set level, for any thread count and any number of rows.

use half::f16;

use super::panel::{self, PanelKernel, PanelRef, BLOCK, PANEL};

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
        panel::matmul(self, x, m)
    }

    /// Row `j` as f32, `q·d + m` per value (ggml's and candle's Q4_1 dequantization).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let (dm, qs) = self.row(j);
        for ((o, [d, m]), q) in out.chunks_exact_mut(BLOCK).zip(dm).zip(qs) {
            for (i, &byte) in q.iter().enumerate() {
                o[i] = (byte & 0x0F) as f32 * d + m;
                o[i + 16] = (byte >> 4) as f32 * d + m;
            }
        }
    }

    fn row(&self, j: usize) -> (&[[f32; 2]], &[[u8; 16]]) {
        let nb = self.k / BLOCK;
        let w = j * nb..(j + 1) * nb;
        (&self.dm[w.clone()], &self.qs[w])
    }
}

impl super::OwnMatrix for Q4_1Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn storage_bytes(&self) -> usize {
        self.storage_bytes()
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul(x, m)
    }

    fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        self.dequantize_row(j, out)
    }
}

impl PanelKernel for Q4_1Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn panel_row(&self, a: PanelRef<'_>, j: usize) -> [f32; PANEL] {
        let (dm, qs) = self.row(j);
        panel_row_with(super::isa(), dm, qs, a)
    }
}

/// The micro-kernel at instruction-set level `isa`, lowered to what this process may use
/// (every level gives the same bits; tests run each).
pub(crate) fn panel_row_with(
    isa: super::Isa,
    dm: &[[f32; 2]],
    qs: &[[u8; 16]],
    a: PanelRef<'_>,
) -> [f32; PANEL] {
    #[cfg(target_arch = "x86_64")]
    {
        match isa.min(super::isa()) {
            // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2 and FMA were detected and seen to execute.
            super::Isa::Avx512 | super::Isa::Avx512Bf16 | super::Isa::Amx => {
                return unsafe { avx512::panel_row(dm, qs, a) }
            }
            // SAFETY: AVX2 and FMA were detected and seen to execute.
            super::Isa::Avx2 => return unsafe { avx2::panel_row(dm, qs, a) },
            super::Isa::Portable => {}
        }
    }
    let _ = isa;
    panel_row_portable(dm, qs, a)
}

/// The same operations as the AVX2 kernel, one lane at a time.
pub(crate) fn panel_row_portable(
    dm: &[[f32; 2]],
    qs: &[[u8; 16]],
    a: PanelRef<'_>,
) -> [f32; PANEL] {
    std::array::from_fn(|r| {
        let mut acc = [0f32; 8];
        let mut summs = 0f32;
        for (b, ([dw, mw], q)) in dm.iter().zip(qs).enumerate() {
            let i = b * PANEL + r;
            let qa = &a.qs[i];
            summs += mw * a.s[i];
            let d = dw * a.d[i];
            for (l, acc_l) in acc.iter_mut().enumerate() {
                let mut xy = 0i32;
                for e in 4 * l..4 * l + 4 {
                    let w = if e < 16 { q[e] & 0x0F } else { q[e - 16] >> 4 } as i32;
                    xy += w * qa[e] as i32;
                }
                *acc_l = d.mul_add(xy as f32, *acc_l);
            }
        }
        panel::hsum8(&acc) + summs
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::panel::{PanelRef, PANEL};
    use std::arch::x86_64::*;

    /// Eight accumulators (one per panel row) stay in registers; each weight block is decoded
    /// once for the eight rows, and their `d_w·d_a` and `m_w·s_a` are one vector product each.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel_row(
        dm: &[[f32; 2]],
        qs: &[[u8; 16]],
        a: PanelRef<'_>,
    ) -> [f32; PANEL] {
        let nb = dm.len();
        assert!(qs.len() == nb && a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        assert!(a.s.len() >= nb * PANEL);
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); PANEL];
        let mut summs = _mm256_setzero_ps();
        let (aq, ad, asum) = (a.qs.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
        for b in 0..nb {
            // SAFETY (all pointer reads): b < nb and the lengths were asserted above.
            let [dw, mw] = *dm.get_unchecked(b);
            let raw = _mm_loadu_si128(qs.as_ptr().add(b) as *const __m128i);
            // Low nibbles → bytes 0..16, high nibbles → bytes 16..32.
            let qw = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
            let da = _mm256_loadu_ps(ad.add(b * PANEL));
            let sa = _mm256_loadu_ps(asum.add(b * PANEL));
            summs = _mm256_add_ps(summs, _mm256_mul_ps(_mm256_set1_ps(mw), sa));
            let mut d = [0f32; PANEL];
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(dw), da));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let qa = _mm256_loadu_si256(aq.add(b * PANEL + r) as *const __m256i);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(qw, qa), ones);
                *acc_r = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), _mm256_cvtepi32_ps(dot), *acc_r);
            }
        }
        let mut s = [0f32; PANEL];
        _mm256_storeu_ps(s.as_mut_ptr(), summs);
        std::array::from_fn(|r| super::super::hsum256(acc[r]) + s[r])
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::avx512::{hsum_pairs, pair_spread};
    use super::super::panel::{PanelRef, PANEL};
    use std::arch::x86_64::*;

    /// The AVX2 kernel with two panel rows per zmm register (rows `2p`, `2p + 1` in lanes
    /// 0..8, 8..16) and `vpdpbusd` (unsigned nibbles × signed activations, four products
    /// summed exactly per i32 lane, as maddubs+madd did) for maddubs+madd; the FMA per lane,
    /// the `m·s` vector and the final sums are the AVX2 kernel's.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn panel_row(
        dm: &[[f32; 2]],
        qs: &[[u8; 16]],
        a: PanelRef<'_>,
    ) -> [f32; PANEL] {
        let nb = dm.len();
        assert!(qs.len() == nb && a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        assert!(a.s.len() >= nb * PANEL);
        let low = _mm256_set1_epi8(0x0F);
        let zero = _mm512_setzero_si512();
        let spread = pair_spread();
        let mut acc = [_mm512_setzero_ps(); PANEL / 2];
        let mut summs = _mm256_setzero_ps();
        let (aq, ad, asum) = (a.qs.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
        for b in 0..nb {
            // SAFETY (all pointer reads): b < nb and the lengths were asserted above; rows
            // 2p and 2p + 1 of a block are adjacent 32-byte arrays.
            let [dw, mw] = *dm.get_unchecked(b);
            let raw = _mm_loadu_si128(qs.as_ptr().add(b) as *const __m128i);
            // Low nibbles → bytes 0..16, high nibbles → bytes 16..32, in both halves.
            let nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
            let qw = _mm512_broadcast_i64x4(nibbles);
            let da = _mm256_loadu_ps(ad.add(b * PANEL));
            let sa = _mm256_loadu_ps(asum.add(b * PANEL));
            summs = _mm256_add_ps(summs, _mm256_mul_ps(_mm256_set1_ps(mw), sa));
            let d = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(dw), da));
            for (p, acc_p) in acc.iter_mut().enumerate() {
                let qa = _mm512_loadu_si512(aq.add(b * PANEL + 2 * p) as *const __m512i);
                let dot = _mm512_dpbusd_epi32(zero, qw, qa);
                let dp = _mm512_permutexvar_ps(spread[p], d);
                *acc_p = _mm512_fmadd_ps(dp, _mm512_cvtepi32_ps(dot), *acc_p);
            }
        }
        let mut s = [0f32; PANEL];
        _mm256_storeu_ps(s.as_mut_ptr(), summs);
        let sums = hsum_pairs(&acc);
        std::array::from_fn(|r| sums[r] + s[r])
    }
}

#[cfg(test)]
mod tests {
    use super::super::panel::tests::{check_kernel, lcg};
    use super::super::panel::Panels;
    use super::*;

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
    fn naive(wm: &Q4_1Matrix, a: &Panels, m: usize) -> Vec<f64> {
        let nb = wm.k / BLOCK;
        let mut out = vec![0f64; m * wm.n];
        for row in 0..m {
            let (p, r) = (a.panel(row / PANEL), row % PANEL);
            for j in 0..wm.n {
                let mut s = 0f64;
                for b in 0..nb {
                    let [d, mn] = wm.dm[j * nb + b];
                    let q = &wm.qs[j * nb + b];
                    let i = b * PANEL + r;
                    for e in 0..32 {
                        let w = if e < 16 { q[e] & 15 } else { q[e - 16] >> 4 } as f64;
                        s += (d as f64 * w) * (p.d[i] as f64 * p.qs[i][e] as f64);
                    }
                    s += mn as f64 * p.s[i] as f64;
                }
                out[row * wm.n + j] = s;
            }
        }
        out
    }

    #[test]
    fn matches_naive_reference_and_every_isa_level_bit_for_bit() {
        let mut seed = 7;
        for &(m, n, k) in &[
            (1, 1, 32),
            (3, 5, 64),
            (7, 33, 96),
            (21, 17, 576),
            (9, 130, 64),
        ] {
            let w = Q4_1Matrix::from_bytes(&random_q4_1(n, k, &mut seed), n, k).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            check_kernel(
                &w,
                &x,
                m,
                |a| naive(&w, a, m),
                |isa, p, j| {
                    let (dm, qs) = w.row(j);
                    panel_row_with(isa, dm, qs, p)
                },
            );
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
        // Rows 3.. start at a different place in their panels.
        let tail = w.matmul(&x[3 * k..], 34);
        assert_eq!(&all[3 * n..], tail.as_slice());
    }
}
