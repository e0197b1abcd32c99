//! Signed 8-bit block weights × f32 activations: GGUF Q5_0 (decoded at load to −16..15) and
//! Q8_0, computed as llama.cpp's CPU backend does: each activation row is quantized to Q8_0
//! (32-value blocks, scale `d`), and each output is `Σ_blocks d_w·d_a·Σ(q_w·q_a)`.
//!
//! Why: Q5_0 is llama.cpp's fallback type for K-quant rows that are not a multiple of 256
//! (Gemma 3's 640-wide rows, SmolLM2's 576 under `--quantize q4_k_m`), and candle's Q5_0 dot
//! product has no SIMD path on x86: Gemma 3 270M Q4_K_M ran at 12.7 tokens/s natively against
//! 154 in f32. Q8_0 is the output layer of both test models (SmolLM2's tied embeddings: a fifth
//! of its multiply-adds); candle's Q8_0 product is SIMD but per row. Decoded weights take 36
//! bytes per block (Q5_0 stores 22, Q8_0 34), and the inner loop is one AVX2 multiply-add of
//! 32 byte pairs.
//!
//! Float order is fixed per output element, as ggml's AVX2 `vec_dot_q5_0_q8_0` and
//! `vec_dot_q8_0_q8_0` order it: eight lanes, lane `l` accumulating
//! `fma(d_w·d_a, Σ_{i<4} q_w[4l+i]·q_a[4l+i], acc_l)` over the blocks, then
//! `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`. The AVX-512 path (VNNI, two panel rows per
//! register) and the portable fallback perform the same operations per lane, so results are
//! bit-identical at every instruction-set level, for any thread count and any number of rows.

use half::f16;

use super::panel::{self, PanelKernel, PanelRef, BLOCK, PANEL};

/// Bytes of one GGUF Q5_0 block: f16 d, 4 bytes of high bits, 16 bytes of nibbles.
pub const Q5_0_BLOCK_BYTES: usize = 22;
/// Bytes of one GGUF Q8_0 block: f16 d, 32 signed bytes.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// A weight matrix `[n, k]` (n outputs, k inputs) of signed 8-bit blocks with f32 scales.
pub struct Int8Matrix {
    n: usize,
    k: usize,
    /// Per block: the scale.
    d: Vec<f32>,
    /// Per block: the 32 values.
    qs: Vec<[i8; 32]>,
}

impl Int8Matrix {
    /// From GGUF Q5_0 bytes of a `[n, k]` tensor.
    pub fn from_q5_0(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        Self::decode(bytes, n, k, Q5_0_BLOCK_BYTES, |b, q| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let nibbles = &b[6..22];
            for j in 0..16 {
                let lo = (nibbles[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                let hi = (nibbles[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                q[j] = lo as i8 - 16;
                q[j + 16] = hi as i8 - 16;
            }
        })
    }

    /// From GGUF Q8_0 bytes of a `[n, k]` tensor.
    pub fn from_q8_0(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        Self::decode(bytes, n, k, Q8_0_BLOCK_BYTES, |b, q| {
            for (qi, &v) in q.iter_mut().zip(&b[2..34]) {
                *qi = v as i8;
            }
        })
    }

    fn decode(
        bytes: &[u8],
        n: usize,
        k: usize,
        block_bytes: usize,
        values: impl Fn(&[u8], &mut [i8; 32]),
    ) -> Option<Self> {
        if !k.is_multiple_of(BLOCK) || bytes.len() != n * k / BLOCK * block_bytes {
            return None;
        }
        let nb = n * k / BLOCK;
        let mut d = Vec::with_capacity(nb);
        let mut qs = Vec::with_capacity(nb);
        for b in bytes.chunks_exact(block_bytes) {
            d.push(f16::from_le_bytes([b[0], b[1]]).to_f32());
            let mut q = [0i8; 32];
            values(b, &mut q);
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
        panel::matmul(self, x, m)
    }

    /// Row `j` as f32, `d·q` per value: the same numbers as ggml's (and candle's) Q5_0 and
    /// Q8_0 dequantization, so a tied embedding can be looked up here.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let (d, qs) = self.row(j);
        for ((o, &d), q) in out.chunks_exact_mut(BLOCK).zip(d).zip(qs) {
            for (o, &q) in o.iter_mut().zip(q) {
                *o = q as f32 * d;
            }
        }
    }

    fn row(&self, j: usize) -> (&[f32], &[[i8; 32]]) {
        let nb = self.k / BLOCK;
        let w = j * nb..(j + 1) * nb;
        (&self.d[w.clone()], &self.qs[w])
    }
}

impl super::OwnMatrix for Int8Matrix {
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

impl PanelKernel for Int8Matrix {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn panel_row(&self, a: PanelRef<'_>, j: usize) -> [f32; PANEL] {
        let (d, qs) = self.row(j);
        panel_row_with(super::isa(), d, qs, a)
    }
}

/// The micro-kernel at instruction-set level `isa`, lowered to what this process may use
/// (every level gives the same bits; tests run each).
pub(crate) fn panel_row_with(
    isa: super::Isa,
    wd: &[f32],
    wqs: &[[i8; 32]],
    a: PanelRef<'_>,
) -> [f32; PANEL] {
    #[cfg(target_arch = "x86_64")]
    {
        match isa.min(super::isa()) {
            // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2 and FMA were detected and seen to execute.
            super::Isa::Avx512 | super::Isa::Avx512Bf16 => {
                return unsafe { avx512::panel_row(wd, wqs, a) }
            }
            // SAFETY: AVX2 and FMA were detected and seen to execute.
            super::Isa::Avx2 => return unsafe { avx2::panel_row(wd, wqs, a) },
            super::Isa::Portable => {}
        }
    }
    let _ = isa;
    panel_row_portable(wd, wqs, a)
}

/// The same operations as the AVX2 kernel, one lane at a time.
pub(crate) fn panel_row_portable(wd: &[f32], wqs: &[[i8; 32]], a: PanelRef<'_>) -> [f32; PANEL] {
    std::array::from_fn(|r| {
        let mut acc = [0f32; 8];
        for (b, (dw, qw)) in wd.iter().zip(wqs).enumerate() {
            let i = b * PANEL + r;
            let qa = &a.qs[i];
            let d = dw * a.d[i];
            for (l, acc_l) in acc.iter_mut().enumerate() {
                let xy: i32 = (4 * l..4 * l + 4)
                    .map(|e| qw[e] as i32 * qa[e] as i32)
                    .sum();
                *acc_l = d.mul_add(xy as f32, *acc_l);
            }
        }
        panel::hsum8(&acc)
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::panel::{PanelRef, PANEL};
    use std::arch::x86_64::*;

    /// Eight accumulators (one per panel row) in registers; `d_w·d_a` for the eight rows is
    /// one vector product per block.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel_row(wd: &[f32], wqs: &[[i8; 32]], a: PanelRef<'_>) -> [f32; PANEL] {
        let nb = wd.len();
        assert!(wqs.len() == nb && a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); PANEL];
        let (aq, ad) = (a.qs.as_ptr(), a.d.as_ptr());
        for b in 0..nb {
            // SAFETY (all pointer reads): b < nb and the lengths were asserted above.
            let qw = _mm256_loadu_si256(wqs.as_ptr().add(b) as *const __m256i);
            // maddubs multiplies unsigned by signed bytes: |w| times a with w's sign.
            let aw = _mm256_sign_epi8(qw, qw);
            let da = _mm256_loadu_ps(ad.add(b * PANEL));
            let mut d = [0f32; PANEL];
            _mm256_storeu_ps(
                d.as_mut_ptr(),
                _mm256_mul_ps(_mm256_set1_ps(*wd.get_unchecked(b)), da),
            );
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let qa = _mm256_loadu_si256(aq.add(b * PANEL + r) as *const __m256i);
                let sa = _mm256_sign_epi8(qa, qw);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones);
                *acc_r = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), _mm256_cvtepi32_ps(dot), *acc_r);
            }
        }
        std::array::from_fn(|r| super::super::hsum256(acc[r]))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::avx512::{hsum_pairs, pair_spread};
    use super::super::panel::{PanelRef, PANEL};
    use std::arch::x86_64::*;

    /// The AVX2 kernel with two panel rows per zmm register (rows `2p`, `2p + 1` in lanes
    /// 0..8, 8..16) and `vpdpbusd` for maddubs+madd: |w| times a with w's sign, four byte
    /// products summed exactly into each i32 lane as before (|w| ≤ 128 and |a| ≤ 127 never
    /// saturated maddubs' i16 pairs), then the same FMA per lane and the same final sums.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn panel_row(wd: &[f32], wqs: &[[i8; 32]], a: PanelRef<'_>) -> [f32; PANEL] {
        let nb = wd.len();
        assert!(wqs.len() == nb && a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        let zero = _mm512_setzero_si512();
        let spread = pair_spread();
        let mut acc = [_mm512_setzero_ps(); PANEL / 2];
        let (aq, ad) = (a.qs.as_ptr(), a.d.as_ptr());
        for b in 0..nb {
            // SAFETY (all pointer reads): b < nb and the lengths were asserted above; rows
            // 2p and 2p + 1 of a block are adjacent 32-byte arrays.
            let w = _mm256_loadu_si256(wqs.as_ptr().add(b) as *const __m256i);
            let qw = _mm512_broadcast_i64x4(w);
            let aw = _mm512_abs_epi8(qw);
            let w_negative = _mm512_movepi8_mask(qw);
            let da = _mm256_loadu_ps(ad.add(b * PANEL));
            let d = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(*wd.get_unchecked(b)), da));
            for (p, acc_p) in acc.iter_mut().enumerate() {
                let qa = _mm512_loadu_si512(aq.add(b * PANEL + 2 * p) as *const __m512i);
                // a with w's sign (where w is 0, |w| is 0 too).
                let sa = _mm512_mask_sub_epi8(qa, w_negative, zero, qa);
                let dot = _mm512_dpbusd_epi32(zero, aw, sa);
                let dp = _mm512_permutexvar_ps(spread[p], d);
                *acc_p = _mm512_fmadd_ps(dp, _mm512_cvtepi32_ps(dot), *acc_p);
            }
        }
        hsum_pairs(&acc)
    }
}

#[cfg(test)]
mod tests {
    use super::super::panel::tests::{check_kernel, lcg};
    use super::super::panel::Panels;
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

    /// Weights dequantized from the raw bytes times the dequantized Q8_0 activations, in f64.
    fn naive(
        bytes: &[u8],
        block_bytes: usize,
        value: fn(&[u8], usize) -> f64,
        (n, k): (usize, usize),
        a: &Panels,
        m: usize,
    ) -> Vec<f64> {
        let nb = k / BLOCK;
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

    fn check(w: &Int8Matrix, want: impl Fn(&Panels, usize) -> Vec<f64>, x: &[f32], m: usize) {
        check_kernel(
            w,
            x,
            m,
            |a| want(a, m),
            |isa, p, j| {
                let (d, qs) = w.row(j);
                panel_row_with(isa, d, qs, p)
            },
        );
    }

    #[test]
    fn q5_0_matches_naive_reference_and_every_isa_level_bit_for_bit() {
        let mut seed = 11;
        for &(m, n, k) in &[
            (1, 1, 32),
            (3, 5, 64),
            (7, 33, 96),
            (21, 17, 640),
            (9, 131, 64),
        ] {
            let bytes = random_q5_0(n, k, &mut seed);
            let w = Int8Matrix::from_q5_0(&bytes, n, k).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let want = |a: &Panels, m| naive(&bytes, Q5_0_BLOCK_BYTES, q5_0_value, (n, k), a, m);
            check(&w, want, &x, m);
        }
    }

    #[test]
    fn q8_0_matches_naive_reference_and_every_isa_level_bit_for_bit() {
        let mut seed = 19;
        for &(m, n, k) in &[
            (1, 1, 32),
            (5, 3, 64),
            (17, 33, 96),
            (8, 9, 576),
            (10, 129, 32),
        ] {
            let bytes = random_q8_0(n, k, &mut seed);
            let w = Int8Matrix::from_q8_0(&bytes, n, k).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let want = |a: &Panels, m| naive(&bytes, Q8_0_BLOCK_BYTES, q8_0_value, (n, k), a, m);
            check(&w, want, &x, m);
        }
    }

    #[test]
    fn dequantized_rows_equal_candles_dequantization() {
        use candle_core::quantized::{GgmlDType, QTensor};
        use candle_core::Device;
        let mut seed = 23;
        let (n, k) = (3, 64);
        for (dtype, bytes) in [
            (GgmlDType::Q8_0, random_q8_0(n, k, &mut seed)),
            (GgmlDType::Q5_0, random_q5_0(n, k, &mut seed)),
        ] {
            let w = match dtype {
                GgmlDType::Q8_0 => Int8Matrix::from_q8_0(&bytes, n, k),
                _ => Int8Matrix::from_q5_0(&bytes, n, k),
            }
            .unwrap();
            let storage = candle_core::quantized::QStorage::from_data(
                std::borrow::Cow::Borrowed(&bytes),
                &Device::Cpu,
                dtype,
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
                assert_eq!(&row, want, "{dtype:?} row {j}");
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_their_neighbours() {
        let mut seed = 5;
        let (n, k) = (40, 128);
        let w = Int8Matrix::from_q5_0(&random_q5_0(n, k, &mut seed), n, k).unwrap();
        let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
        let all = w.matmul(&x, 37);
        for r in [0, 5, 16, 36] {
            let one = w.matmul(&x[r * k..(r + 1) * k], 1);
            assert_eq!(&all[r * n..(r + 1) * n], one.as_slice());
        }
        let tail = w.matmul(&x[5 * k..], 32);
        assert_eq!(&all[5 * n..], tail.as_slice());
    }

    /// Throughput of a Llama-3.2-1B FFN matrix (Q8_0 `[8192, 2048]`, m = 512) on 1 and 2
    /// threads at the process's level; compare levels with `PPL_ISA=avx2`:
    /// `cargo test --release --lib int8::tests::q8_0_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn q8_0_throughput() {
        let mut seed = 1;
        let (m, n, k) = (512, 8192, 2048);
        let w = Int8Matrix::from_q8_0(&random_q8_0(n, k, &mut seed), n, k).unwrap();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let best = (0..3)
                .map(|_| {
                    let t = std::time::Instant::now();
                    std::hint::black_box(pool.install(|| w.matmul(&x, m)));
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            let gflops = 2.0 * (m * n * k) as f64 / best / 1e9;
            println!(
                "Q8_0 [{n}, {k}] m {m}, {} kernels, {threads} thread(s): {best:.3} s, {gflops:.1} GFLOP/s",
                super::super::isa().name()
            );
        }
    }

    #[test]
    fn decoding_covers_the_extremes() {
        // qh all ones, nibbles 0xF → +15; qh zero, nibbles 0 → −16.
        let mut b = vec![0u8; Q5_0_BLOCK_BYTES];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2..6].copy_from_slice(&0x0000_FFFFu32.to_le_bytes());
        for v in &mut b[6..] {
            *v = 0x0F;
        }
        let w = Int8Matrix::from_q5_0(&b, 1, 32).unwrap();
        assert_eq!(&w.qs[0][..16], &[15i8; 16]);
        assert_eq!(&w.qs[0][16..], &[-16i8; 16]);
        assert!(Int8Matrix::from_q5_0(&b[..21], 1, 32).is_none());
        let mut q8 = vec![0u8; Q8_0_BLOCK_BYTES];
        q8[2] = 0x80;
        q8[33] = 0x7F;
        let w = Int8Matrix::from_q8_0(&q8, 1, 32).unwrap();
        assert_eq!((w.qs[0][0], w.qs[0][31]), (-128, 127));
        assert!(Int8Matrix::from_q8_0(&q8, 2, 32).is_none());
    }
}
