//! GGUF Q6_K × Q8_K: 256 values per super-block in sixteen 16-value sub-blocks, each with a
//! signed 8-bit scale; value `e` is `d·scale_{e/16}·(q_e − 32)`, q 6-bit (a nibble plus two
//! high bits).
//!
//! Per output and super-block (ggml's `ggml_vec_dot_q6_K_q8_K` structure):
//! `sum = Σ_s scale_s·Σ_e q_e·a_e − 32·Σ_s scale_s·bsum_s`, exact in i32 (the SIMD paths
//! multiply the unsigned q, the offset comes through the activation sums), then the float order
//! of [`super`] (no mins term). Held exactly as the file's 210 bytes per super-block.

use half::f16;

use super::super::panel::PANEL;
use super::super::Isa;
use super::q8k::Q8KPanel;
use super::{path, rows_portable, KQuantMatrix, SuperBlock, QK_K};

/// A Q6_K weight matrix.
pub type Q6KMatrix = KQuantMatrix<Q6KBlock>;

/// One Q6_K super-block, as in the file. Value `128h + 32i + l` (h < 2, i < 4, l < 32) has
/// its low four bits in byte `64h + 32(i mod 2) + l` of `ql` (low nibble for i < 2, high
/// otherwise) and its top two bits at bit `2i` of byte `32h + l` of `qh`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Q6KBlock {
    ql: [u8; 128],
    qh: [u8; 64],
    scales: [i8; 16],
    d: f16,
}

impl Q6KBlock {
    /// The unsigned 6-bit value (0..64) of `e`.
    #[inline(always)]
    fn value(&self, e: usize) -> u8 {
        let (h, i, l) = (e / 128, (e / 32) % 4, e % 32);
        let byte = self.ql[64 * h + 32 * (i % 2) + l];
        let low = if i < 2 { byte & 0x0F } else { byte >> 4 };
        low | (((self.qh[32 * h + l] >> (2 * i)) & 3) << 4)
    }
}

impl SuperBlock for Q6KBlock {
    /// 128 bytes of nibbles, 64 of high bit pairs, 16 signed scales, f16 d.
    const FILE_BYTES: usize = 210;

    fn decode(file: &[u8]) -> Self {
        Self {
            ql: file[0..128].try_into().expect("128 bytes"),
            qh: file[128..192].try_into().expect("64 bytes"),
            scales: std::array::from_fn(|s| file[192 + s] as i8),
            d: f16::from_le_bytes([file[208], file[209]]),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (e, o) in out[..QK_K].iter_mut().enumerate() {
            let q = self.value(e) as i8 - 32;
            *o = d * self.scales[e / 16] as f32 * q as f32;
        }
    }

    fn panel_rows(blocks: &[Self], nb: usize, a: Q8KPanel<'_>, out: &mut [[f32; PANEL]], isa: Isa) {
        match path(isa) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `path` allows AVX-512 only where the CPU has it.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe {
                simd::panel_rows_avx512(blocks, nb, a, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `path` allows AVX2 only where the CPU has it (and FMA, F16C).
            Isa::Avx2 => unsafe { simd::panel_rows_avx2(blocks, nb, a, out) },
            _ => rows_portable(blocks, nb, a, out, panel_row_portable),
        }
    }
}

/// The definition: one row at a time, the operations every SIMD path performs per lane.
pub(crate) fn panel_row_portable(row: &[Q6KBlock], a: Q8KPanel<'_>) -> [f32; PANEL] {
    std::array::from_fn(|r| {
        let mut acc = 0f32;
        for (b, blk) in row.iter().enumerate() {
            let qa = &a.qs[b * PANEL + r];
            let mut sum = 0i32;
            for (s, &scale) in blk.scales.iter().enumerate() {
                let dot: i32 = (16 * s..16 * s + 16)
                    .map(|e| (blk.value(e) as i32 - 32) * qa[e] as i32)
                    .sum();
                sum += scale as i32 * dot;
            }
            let da = a.d[b * PANEL + r];
            acc = (blk.d.to_f32() * da).mul_add(sum as f32, acc);
        }
        acc
    })
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::x86::{accumulate, halves, join, lanes, rows_dot, sum_each512};
    use super::super::x86::{rows_dot128, spread_scales, sum_each, weighted_sums};
    use super::super::GROUP;
    use super::*;
    use std::arch::x86_64::*;

    /// The −32 offset of each row through the activation sums (`32·scale` fits in i16), to
    /// subtract from the row's sums, before their reduction.
    #[target_feature(enable = "avx2")]
    unsafe fn offsets(blk: &Q6KBlock, a: Q8KPanel<'_>, b: usize) -> [__m256i; PANEL] {
        let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.scales.as_ptr() as *const __m128i));
        weighted_sums(&a.bsums[b * PANEL..], _mm256_slli_epi16::<5>(scales))
    }

    /// The float tail shared by both paths: one super-block's reduced sums (lane r: row r)
    /// folded into the accumulators of the eight rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fold_super_block(
        acc: __m256,
        blk: &Q6KBlock,
        a: Q8KPanel<'_>,
        b: usize,
        sums: __m256i,
    ) -> __m256 {
        // SAFETY: the callers checked that `a` holds super-block b.
        let da = _mm256_loadu_ps(a.d.as_ptr().add(b * PANEL));
        accumulate(acc, halves(blk.d.to_bits() as u32).0, da, sums)
    }

    fn check_sizes(blocks: &[Q6KBlock], nb: usize, a: Q8KPanel<'_>, out: &[[f32; PANEL]]) {
        assert!(out.len() <= GROUP && blocks.len() == out.len() * nb);
        assert!(a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        assert!(a.bsums.len() >= nb * PANEL);
    }

    /// `scale_{2G}` in the low 128-bit lane, `scale_{2G+1}` in the high one, as i16.
    #[target_feature(enable = "avx2")]
    fn group_scales(blk: &Q6KBlock, group: usize) -> __m256i {
        _mm256_set_m128i(
            _mm_set1_epi16(blk.scales[2 * group + 1] as i16),
            _mm_set1_epi16(blk.scales[2 * group] as i16),
        )
    }

    /// Super-block by super-block, for each weight row of the group: each 32-value group
    /// decoded once (unsigned, 0..64), then multiplied with the eight rows' activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel_rows_avx2(
        blocks: &[Q6KBlock],
        nb: usize,
        a: Q8KPanel<'_>,
        out: &mut [[f32; PANEL]],
    ) {
        check_sizes(blocks, nb, a, out);
        let low = _mm256_set1_epi8(0x0F);
        let two_bits = _mm256_set1_epi8(3);
        let mut acc = [_mm256_setzero_ps(); GROUP];
        for b in 0..nb {
            // SAFETY (activation reads): super-block b of all eight rows, checked above.
            let qa = a.qs.as_ptr().add(b * PANEL) as *const i8;
            for (c, acc) in acc.iter_mut().enumerate().take(out.len()) {
                let blk = &blocks[c * nb + b];
                let mut sums = [_mm256_setzero_si256(); PANEL];
                for h in 0..2 {
                    let ql = [
                        _mm256_loadu_si256(blk.ql.as_ptr().add(64 * h) as *const __m256i),
                        _mm256_loadu_si256(blk.ql.as_ptr().add(64 * h + 32) as *const __m256i),
                    ];
                    let mut high =
                        _mm256_loadu_si256(blk.qh.as_ptr().add(32 * h) as *const __m256i);
                    for i in 0..4 {
                        let nibbles = if i < 2 {
                            ql[i]
                        } else {
                            _mm256_srli_epi16::<4>(ql[i - 2])
                        };
                        // 16-bit shifts by at most 6: what crosses from the upper byte stays
                        // above the two bits kept.
                        let w = _mm256_or_si256(
                            _mm256_and_si256(nibbles, low),
                            _mm256_slli_epi16::<4>(_mm256_and_si256(high, two_bits)),
                        );
                        high = _mm256_srli_epi16::<2>(high);
                        let group = 4 * h + i;
                        let scale = group_scales(blk, group);
                        rows_dot(&mut sums, w, scale, qa.add(32 * group), QK_K);
                    }
                }
                let offsets = offsets(blk, a, b);
                let sums: [__m256i; PANEL] =
                    std::array::from_fn(|r| _mm256_sub_epi32(sums[r], offsets[r]));
                *acc = fold_super_block(*acc, blk, a, b, sum_each(&sums));
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes(acc);
        }
    }

    /// [`rows_dot128`]'s scale layout for values `128h .. 128h + 128`: 128-bit lane L of its
    /// first 64 values is sub-block 8h + L, of the next 64 sub-block 8h + 4 + L.
    const fn scale_index(h: usize) -> [i16; 32] {
        let mut index = [0i16; 32];
        let mut e = 0;
        while e < 32 {
            let (lane, p) = (e / 8, e % 8);
            index[e] = (8 * h + lane + 4 * (p >= 4) as usize) as i16;
            e += 1;
        }
        index
    }

    const SCALE_INDEX: [[i16; 32]; 2] = [scale_index(0), scale_index(1)];

    /// As the AVX2 path, two 32-value groups (four sub-blocks) in one 512-bit register, four
    /// groups per [`rows_dot128`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn panel_rows_avx512(
        blocks: &[Q6KBlock],
        nb: usize,
        a: Q8KPanel<'_>,
        out: &mut [[f32; PANEL]],
    ) {
        check_sizes(blocks, nb, a, out);
        let low = _mm512_set1_epi8(0x0F);
        let two_bits = _mm512_set1_epi8(3);
        let mut acc = [_mm256_setzero_ps(); GROUP];
        for b in 0..nb {
            // SAFETY (activation reads): super-block b of all eight rows, checked above.
            let qa = a.qs.as_ptr().add(b * PANEL) as *const i8;
            for (c, acc) in acc.iter_mut().enumerate().take(out.len()) {
                let blk = &blocks[c * nb + b];
                let mut sums = [_mm512_setzero_si512(); PANEL];
                let scales =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.scales.as_ptr() as *const __m128i));
                for (h, scale_index) in SCALE_INDEX.iter().enumerate() {
                    // Groups 4h and 4h + 1 (then 4h + 2 and 4h + 3): the same 64 bytes of ql,
                    // low then high nibbles; their high bits at 2i and 2i + 2.
                    let ql = _mm512_loadu_si512(blk.ql.as_ptr().add(64 * h) as *const __m512i);
                    let qh = _mm256_loadu_si256(blk.qh.as_ptr().add(32 * h) as *const __m256i);
                    let mut high = join(qh, _mm256_srli_epi16::<2>(qh));
                    let mut w = [_mm512_setzero_si512(); 2];
                    for i in [0, 2] {
                        let nibbles = if i == 0 {
                            ql
                        } else {
                            _mm512_srli_epi16::<4>(ql)
                        };
                        w[i / 2] = _mm512_or_si512(
                            _mm512_and_si512(nibbles, low),
                            _mm512_slli_epi16::<4>(_mm512_and_si512(high, two_bits)),
                        );
                        high = _mm512_srli_epi16::<4>(high);
                    }
                    let scale = spread_scales(scales, scale_index);
                    rows_dot128(&mut sums, w, scale, qa.add(128 * h), QK_K);
                }
                let offsets = offsets(blk, a, b);
                let sums: [__m512i; PANEL] = std::array::from_fn(|r| {
                    _mm512_sub_epi32(sums[r], _mm512_zextsi256_si512(offsets[r]))
                });
                *acc = fold_super_block(*acc, blk, a, b, sum_each512(&sums));
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes(acc);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, check_matmul, random_byte, random_f16};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: random values and signed scales (−128 included), a finite d.
    pub(crate) fn random_q6k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for b in 0..n * k / QK_K {
            for i in 0..208 {
                // Some scales at the extremes, −128 and 127.
                let v = match (b % 3, i) {
                    (0, 192) => 0x80,
                    (0, 193) => 0x7F,
                    _ => random_byte(seed),
                };
                bytes.push(v);
            }
            bytes.extend_from_slice(&random_f16(seed, 0.001));
        }
        bytes
    }

    /// Value `e` of a super-block by the GGUF definition, in f64.
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
        let d = f16::from_le_bytes([blk[208], blk[209]]).to_f64();
        let scale = blk[192 + e / 16] as i8 as f64;
        let (h, l) = (e / 128, e % 32);
        let (ql, qh) = (&blk[64 * h..], blk[128 + 32 * h + l]);
        let q = match (e / 32) % 4 {
            0 => (ql[l] & 15) | ((qh & 3) << 4),
            1 => (ql[l + 32] & 15) | (((qh >> 2) & 3) << 4),
            2 => (ql[l] >> 4) | (((qh >> 4) & 3) << 4),
            _ => (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4),
        };
        d * scale * (q as f64 - 32.0)
    }

    #[test]
    fn matches_naive_reference_on_every_path_bit_for_bit() {
        check_matmul::<Q6KBlock>(random_q6k, reference);
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q6KBlock>(GgmlDType::Q6K, random_q6k);
    }
}
