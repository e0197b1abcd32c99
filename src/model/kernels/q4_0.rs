//! Q4_0 weights × f32 activations, computed as llama.cpp's CPU backend does: each activation
//! row is quantized to Q8_0 (32-value blocks, scale `d`; the values and scales of
//! [`panel`]'s Q8_1 panels), and each output is `Σ_blocks d_w·d_a·Σ((n_w − 8)·q_a)`.
//!
//! Why: Q4_0 files are common, and candle's Q4_0 product runs one activation row at a time.
//! The weights stay as the file holds them, 18 bytes per 32 values (an f16 scale and 16 bytes
//! of nibbles): each block is decoded in registers once per panel of eight activation rows.
//!
//! Float order is fixed per output element and mirrors ggml's AVX2 `vec_dot_q4_0_q8_0`: eight
//! lanes, lane `l` accumulating `fma(d_w·d_a, Σ_{i<4} q_w[4l+i]·q_a[4l+i], acc_l)` over the
//! blocks, then `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`. The integer sums are exact whichever
//! instructions form them (AVX2's `maddubs`+`madd` cannot saturate here: |q_w| ≤ 8,
//! |q_a| ≤ 127; AVX-512 VNNI's `vpdpbusd` adds the same four products), so the AVX-512 path
//! (two panel rows per 512-bit register), the AVX2 path and the portable one give the same
//! bits, for any thread count and any number of rows.

use half::f16;

use super::panel::{self, PanelKernel, PanelRef, BLOCK, PANEL};
use super::Isa;

/// Bytes of one GGUF Q4_0 block: f16 d, 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 18;

/// A Q4_0 weight matrix `[n, k]` (n outputs, k inputs), held as the file's blocks.
pub struct Q4_0Matrix {
    n: usize,
    k: usize,
    /// Per block: the f16 scale's bits.
    d: Vec<u16>,
    /// Per block: 16 bytes; element i < 16 is the low nibble of byte i, element 16+i the high,
    /// each minus 8.
    qs: Vec<[u8; 16]>,
}

impl Q4_0Matrix {
    /// From GGUF Q4_0 bytes of a `[n, k]` tensor.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let blocks = n.checked_mul(k)? / BLOCK;
        if k == 0 || !k.is_multiple_of(BLOCK) || bytes.len() != blocks.checked_mul(BLOCK_BYTES)? {
            return None;
        }
        let mut d = Vec::with_capacity(blocks);
        let mut qs = Vec::with_capacity(blocks);
        for b in bytes.chunks_exact(BLOCK_BYTES) {
            d.push(u16::from_le_bytes([b[0], b[1]]));
            let mut q = [0u8; 16];
            q.copy_from_slice(&b[2..]);
            qs.push(q);
        }
        Some(Self { n, k, d, qs })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held: 18 per block, as in the file.
    pub fn storage_bytes(&self) -> usize {
        self.d.len() * 2 + self.qs.len() * 16
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        panel::matmul(self, x, m)
    }

    /// Row `j` as f32, `(n − 8)·d` per value (ggml's and candle's Q4_0 dequantization).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let (d, qs) = self.row(j);
        for ((o, &d), q) in out.chunks_exact_mut(BLOCK).zip(d).zip(qs) {
            let d = f16::from_bits(d).to_f32();
            for (i, &byte) in q.iter().enumerate() {
                o[i] = ((byte & 0x0F) as i32 - 8) as f32 * d;
                o[i + 16] = ((byte >> 4) as i32 - 8) as f32 * d;
            }
        }
    }

    fn row(&self, j: usize) -> (&[u16], &[[u8; 16]]) {
        let nb = self.k / BLOCK;
        let w = j * nb..(j + 1) * nb;
        (&self.d[w.clone()], &self.qs[w])
    }

    /// Weight row `j` against panel `a` at instruction level `isa` (which the CPU must run).
    fn panel_row_at(&self, a: PanelRef<'_>, j: usize, isa: Isa) -> [f32; PANEL] {
        let (d, qs) = self.row(j);
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the callers pass a level this CPU runs (`isa()` or below).
            if isa >= Isa::Avx512 {
                return unsafe { x86::panel_row_avx512(d, qs, a) };
            }
            if isa >= Isa::Avx2 {
                return unsafe { x86::panel_row_avx2(d, qs, a) };
            }
        }
        let _ = isa;
        panel_row_portable(d, qs, a)
    }
}

impl super::OwnMatrix for Q4_0Matrix {
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

impl PanelKernel for Q4_0Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn panel_row(&self, a: PanelRef<'_>, j: usize) -> [f32; PANEL] {
        self.panel_row_at(a, j, super::isa())
    }
}

/// The weight value `e` (0..32) of a block: a nibble minus 8.
fn weight(q: &[u8; 16], e: usize) -> i32 {
    let nibble = if e < 16 { q[e] & 0x0F } else { q[e - 16] >> 4 };
    nibble as i32 - 8
}

/// The definition, one lane at a time.
pub(crate) fn panel_row_portable(d: &[u16], qs: &[[u8; 16]], a: PanelRef<'_>) -> [f32; PANEL] {
    std::array::from_fn(|r| {
        let mut acc = [0f32; 8];
        for (b, (&dw, q)) in d.iter().zip(qs).enumerate() {
            let i = b * PANEL + r;
            let qa = &a.qs[i];
            let scale = f16::from_bits(dw).to_f32() * a.d[i];
            for (l, acc_l) in acc.iter_mut().enumerate() {
                let xy: i32 = (4 * l..4 * l + 4)
                    .map(|e| weight(q, e) * qa[e] as i32)
                    .sum();
                *acc_l = scale.mul_add(xy as f32, *acc_l);
            }
        }
        panel::hsum8(&acc)
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::hsum256;
    use super::super::panel::{PanelRef, PANEL};
    use std::arch::x86_64::*;

    /// 32 signed weights (−8..7) of a block, in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(q: &[u8; 16]) -> __m256i {
        let raw = _mm_loadu_si128(q.as_ptr() as *const __m128i);
        // Low nibbles → bytes 0..16, high nibbles → bytes 16..32.
        let nibbles = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw),
            _mm256_set1_epi8(0x0F),
        );
        _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8))
    }

    /// `d_w·d_a` for the eight panel rows of block `b`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(dw: u16, ad: *const f32) -> __m256 {
        let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(dw as i32)));
        _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_loadu_ps(ad))
    }

    fn check(d: &[u16], qs: &[[u8; 16]], a: PanelRef<'_>) -> usize {
        let nb = d.len();
        assert!(qs.len() == nb && a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        nb
    }

    /// Eight accumulators (one per panel row) in registers; each block decoded once for the
    /// eight rows.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel_row_avx2(
        d: &[u16],
        qs: &[[u8; 16]],
        a: PanelRef<'_>,
    ) -> [f32; PANEL] {
        let nb = check(d, qs, a);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); PANEL];
        let (aq, ad) = (a.qs.as_ptr(), a.d.as_ptr());
        for b in 0..nb {
            // SAFETY (all pointer reads): b < nb and the lengths were checked above.
            let qw = decode(qs.get_unchecked(b));
            // maddubs multiplies unsigned by signed bytes: |w| times a with w's sign.
            let aw = _mm256_sign_epi8(qw, qw);
            let mut scale = [0f32; PANEL];
            _mm256_storeu_ps(
                scale.as_mut_ptr(),
                scales(*d.get_unchecked(b), ad.add(b * PANEL)),
            );
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let qa = _mm256_loadu_si256(aq.add(b * PANEL + r) as *const __m256i);
                let sa = _mm256_sign_epi8(qa, qw);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones);
                *acc_r = _mm256_fmadd_ps(_mm256_set1_ps(scale[r]), _mm256_cvtepi32_ps(dot), *acc_r);
            }
        }
        std::array::from_fn(|r| hsum256(acc[r]))
    }

    /// Two panel rows per 512-bit accumulator (row `2q` in the low half, `2q+1` in the high
    /// half), the block's weights in both halves; VNNI forms each lane's four products.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn panel_row_avx512(
        d: &[u16],
        qs: &[[u8; 16]],
        a: PanelRef<'_>,
    ) -> [f32; PANEL] {
        const PAIRS: usize = PANEL / 2;
        let nb = check(d, qs, a);
        let mut acc = [_mm512_setzero_ps(); PAIRS];
        // Lanes 0..8 take row 2q's scale, lanes 8..16 row 2q+1's.
        let spread: [__m512i; PAIRS] = [
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
            _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),
            _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6),
        ];
        let zero = _mm512_setzero_si512();
        let (aq, ad) = (a.qs.as_ptr(), a.d.as_ptr());
        for b in 0..nb {
            // SAFETY (all pointer reads): b < nb and the lengths were checked above.
            let qw = _mm512_broadcast_i64x4(decode(qs.get_unchecked(b)));
            // vpdpbusd multiplies unsigned by signed bytes: |w| times a negated where w < 0.
            let aw = _mm512_abs_epi8(qw);
            let negative = _mm512_movepi8_mask(qw);
            let scale = _mm512_castps256_ps512(scales(*d.get_unchecked(b), ad.add(b * PANEL)));
            for (q, acc_q) in acc.iter_mut().enumerate() {
                let qa = _mm512_loadu_si512(aq.add(b * PANEL + 2 * q) as *const _);
                let sa = _mm512_mask_sub_epi8(qa, negative, zero, qa);
                let dot = _mm512_dpbusd_epi32(zero, aw, sa);
                let s = _mm512_permutexvar_ps(spread[q], scale);
                *acc_q = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), *acc_q);
            }
        }
        let mut out = [0f32; PANEL];
        for (q, acc_q) in acc.iter().enumerate() {
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*acc_q));
            out[2 * q] = hsum256(_mm512_castps512_ps256(*acc_q));
            out[2 * q + 1] = hsum256(_mm256_castpd_ps(high));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::panel::tests::{check_kernel, lcg};
    use super::super::panel::Panels;
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

    /// Dequantized weights times the dequantized Q8_0 activations, in f64.
    fn naive(wm: &Q4_0Matrix, a: &Panels, m: usize) -> Vec<f64> {
        let nb = wm.k / BLOCK;
        let mut out = vec![0f64; m * wm.n];
        for row in 0..m {
            let (p, r) = (a.panel(row / PANEL), row % PANEL);
            for j in 0..wm.n {
                let mut s = 0f64;
                for b in 0..nb {
                    let d = f16::from_bits(wm.d[j * nb + b]).to_f64();
                    let i = b * PANEL + r;
                    for e in 0..32 {
                        let w = weight(&wm.qs[j * nb + b], e) as f64;
                        s += (d * w) * (p.d[i] as f64 * p.qs[i][e] as f64);
                    }
                }
                out[row * wm.n + j] = s;
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
        ] {
            let w = Q4_0Matrix::from_bytes(&random_q4_0(n, k, &mut seed), n, k).expect("layout");
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            check_kernel(
                &w,
                &x,
                m,
                |a| naive(&w, a, m),
                |isa, p, j| w.panel_row_at(p, j, isa),
            );
            let a = Panels::quantize(&x, m, k);
            for isa in levels() {
                for p in 0..m.div_ceil(PANEL) {
                    for j in 0..n {
                        let want = w.panel_row_at(a.panel(p), j, Isa::Portable);
                        let got = w.panel_row_at(a.panel(p), j, isa);
                        assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "{isa:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn extreme_blocks_give_the_same_bits_on_every_path() {
        // Every weight −8 (the largest magnitude) against ±127 activations.
        let (n, k) = (2, 64);
        let mut bytes = Vec::new();
        for b in 0..n * k / BLOCK {
            bytes.extend_from_slice(
                &f16::from_f32(if b % 2 == 0 { 1.0 } else { -3.5 }).to_le_bytes(),
            );
            bytes.extend_from_slice(&[if b % 2 == 0 { 0x00 } else { 0xF0 }; 16]);
        }
        let w = Q4_0Matrix::from_bytes(&bytes, n, k).expect("layout");
        let x: Vec<f32> = (0..9 * k)
            .map(|i| if i % 3 == 0 { 100.0 } else { -100.0 })
            .collect();
        let a = Panels::quantize(&x, 9, k);
        for isa in levels() {
            for p in 0..2 {
                for j in 0..n {
                    let want = w.panel_row_at(a.panel(p), j, Isa::Portable);
                    let got = w.panel_row_at(a.panel(p), j, isa);
                    assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "{isa:?}");
                }
            }
        }
    }

    #[test]
    fn dequantized_rows_equal_candles_dequantization() {
        use candle_core::quantized::{GgmlDType, QStorage, QTensor};
        use candle_core::Device;
        let mut seed = 31;
        let (n, k) = (3, 96);
        let bytes = random_q4_0(n, k, &mut seed);
        let w = Q4_0Matrix::from_bytes(&bytes, n, k).expect("layout");
        assert_eq!(w.storage_bytes(), bytes.len());
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
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&row), bits(want), "row {j}");
        }
    }

    /// Throughput against candle's Q4_0 matmul on the same blocks: `cargo test --release
    /// --lib kernels::q4_0::tests::throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn throughput_against_candles_q4_0_matmul() {
        use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
        use candle_core::{Device, Module, Tensor};
        let mut seed = 1;
        for &(m, n, k) in &[(512, 8192, 2048), (512, 2048, 8192)] {
            let bytes = random_q4_0(n, k, &mut seed);
            let w = Q4_0Matrix::from_bytes(&bytes, n, k).expect("layout");
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
            let storage = QStorage::from_data(
                std::borrow::Cow::Borrowed(&bytes),
                &Device::Cpu,
                GgmlDType::Q4_0,
            )
            .unwrap();
            let q = QMatMul::from_arc(std::sync::Arc::new(QTensor::new(storage, (n, k)).unwrap()))
                .unwrap();
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            let time = |f: &dyn Fn()| {
                f();
                let t = std::time::Instant::now();
                for _ in 0..3 {
                    f();
                }
                t.elapsed().as_secs_f64() / 3.0
            };
            let ours = time(&|| {
                std::hint::black_box(w.matmul(&x, m));
            });
            let theirs = time(&|| {
                std::hint::black_box(q.forward(&xt).unwrap());
            });
            let flops = 2.0 * (m * n * k) as f64;
            println!(
                "Q4_0 m={m} [{n} x {k}] {} threads ({}): ours {:.1} GFLOP/s, candle {:.1}; \
                 speed-up {:.2}x",
                rayon::current_num_threads(),
                super::super::isa().name(),
                flops / ours / 1e9,
                flops / theirs / 1e9,
                theirs / ours
            );
        }
    }

    #[test]
    fn rows_do_not_depend_on_their_neighbours() {
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
        assert!(Q4_0Matrix::from_bytes(&[0; 17], 1, 32).is_none());
        assert!(Q4_0Matrix::from_bytes(&[0; 18], 1, 31).is_none());
        assert!(Q4_0Matrix::from_bytes(&[], 1, 0).is_none());
    }
}
