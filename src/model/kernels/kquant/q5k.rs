//! GGUF Q5_K × Q8_K: 256 values per super-block in eight 32-value sub-blocks, each with a
//! 6-bit scale and min; value `e` of sub-block `s` is `d·scale_s·q_e − dmin·min_s`, q 5-bit
//! (a nibble plus one high bit).
//!
//! Per output and super-block (ggml's `ggml_vec_dot_q5_K_q8_K` structure):
//! `sum = Σ_s scale_s·Σ_e q_e·a_e` and `mins = Σ_s min_s·(bsum_{2s} + bsum_{2s+1})`, exact in
//! i32, then the float order of [`super`]. Held as 180 bytes per super-block (the file's 176
//! with the twelve bytes of packed scales and mins unpacked to sixteen); the 5-bit values stay
//! split in nibbles and high bits as in the file and are assembled in registers.

use half::f16;

use super::super::panel::PANEL;
use super::super::Isa;
use super::q8k::Q8KPanel;
use super::{path, rows_portable, unpack_scales_mins, KQuantMatrix, SuperBlock, QK_K};

/// A Q5_K weight matrix.
pub type Q5KMatrix = KQuantMatrix<Q5KBlock>;

/// One Q5_K super-block, scales and mins unpacked.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Q5KBlock {
    pub(crate) d: f16,
    pub(crate) dmin: f16,
    pub(crate) scales: [u8; 8],
    pub(crate) mins: [u8; 8],
    /// Byte `i`, bit `2g` (resp. `2g + 1`): bit 4 of value `64g + i` (resp. `64g + 32 + i`).
    qh: [u8; 32],
    /// Byte `32g + i`: bits 0–3 of value `64g + i` in the low nibble, of `64g + 32 + i` in the
    /// high one.
    qs: [u8; 128],
}

impl SuperBlock for Q5KBlock {
    /// f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 32 bytes of high bits, 128
    /// bytes of nibbles.
    const FILE_BYTES: usize = 176;

    fn decode(file: &[u8]) -> Self {
        let packed: &[u8; 12] = file[4..16].try_into().expect("12 bytes");
        let (scales, mins) = unpack_scales_mins(packed);
        Self {
            d: f16::from_le_bytes([file[0], file[1]]),
            dmin: f16::from_le_bytes([file[2], file[3]]),
            scales,
            mins,
            qh: file[16..48].try_into().expect("32 bytes"),
            qs: file[48..176].try_into().expect("128 bytes"),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        for (g, out) in out.chunks_exact_mut(64).enumerate() {
            let (lo, hi) = out.split_at_mut(32);
            let (d1, m1) = (
                d * self.scales[2 * g] as f32,
                dmin * self.mins[2 * g] as f32,
            );
            let (d2, m2) = (
                d * self.scales[2 * g + 1] as f32,
                dmin * self.mins[2 * g + 1] as f32,
            );
            let nibbles = &self.qs[32 * g..32 * g + 32];
            for (i, (l, h)) in lo.iter_mut().zip(hi).enumerate() {
                let (q_lo, q_hi) = self.values(g, i, nibbles[i]);
                *l = d1 * q_lo as f32 - m1;
                *h = d2 * q_hi as f32 - m2;
            }
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

impl Q5KBlock {
    /// Values `64g + i` and `64g + 32 + i`, whose low bits are in `nibbles`.
    #[inline(always)]
    fn values(&self, g: usize, i: usize, nibbles: u8) -> (u8, u8) {
        let high = self.qh[i] >> (2 * g);
        (
            (nibbles & 0x0F) | ((high & 1) << 4),
            (nibbles >> 4) | ((high & 2) << 3),
        )
    }
}

/// The definition: one row at a time, the operations every SIMD path performs per lane.
pub(crate) fn panel_row_portable(row: &[Q5KBlock], a: Q8KPanel<'_>) -> [f32; PANEL] {
    std::array::from_fn(|r| {
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for (b, blk) in row.iter().enumerate() {
            let qa = &a.qs[b * PANEL + r];
            let mut sum = 0i32;
            for g in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for i in 0..32 {
                    let (q_lo, q_hi) = blk.values(g, i, blk.qs[32 * g + i]);
                    lo += q_lo as i32 * qa[64 * g + i] as i32;
                    hi += q_hi as i32 * qa[64 * g + 32 + i] as i32;
                }
                sum += blk.scales[2 * g] as i32 * lo + blk.scales[2 * g + 1] as i32 * hi;
            }
            let bsums = &a.bsums[b * PANEL + r];
            let mins: i32 = (0..8)
                .map(|s| blk.mins[s] as i32 * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32))
                .sum();
            let da = a.d[b * PANEL + r];
            acc = (blk.d.to_f32() * da).mul_add(sum as f32, acc);
            acc_min = (blk.dmin.to_f32() * da).mul_add(mins as f32, acc_min);
        }
        acc - acc_min
    })
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::q8k::SUB_BLOCK_PAIRS;
    use super::super::x86::{accumulate, halves, join, lanes, rows_dot, sum_each512};
    use super::super::x86::{rows_dot128, spread_scales, sub_block_weighted, sum_each};
    use super::super::GROUP;
    use super::*;
    use std::arch::x86_64::*;

    /// The float tail shared by both paths: the mins through the activation sums, then one
    /// super-block's sums folded into the accumulators of the eight rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fold_super_block(
        acc: &mut [__m256; 2],
        blk: &Q5KBlock,
        a: Q8KPanel<'_>,
        b: usize,
        sums: __m256i,
    ) {
        let mins = sub_block_weighted(&a.sub_block_sums[b * SUB_BLOCK_PAIRS..], &blk.mins);
        // SAFETY: the callers asserted that `a` holds super-block b.
        let da = _mm256_loadu_ps(a.d.as_ptr().add(b * PANEL));
        let (d, dmin) = halves(blk.d.to_bits() as u32 | (blk.dmin.to_bits() as u32) << 16);
        acc[0] = accumulate(acc[0], d, da, sums);
        acc[1] = accumulate(acc[1], dmin, da, mins);
    }

    fn check_sizes(blocks: &[Q5KBlock], nb: usize, a: Q8KPanel<'_>, out: &[[f32; PANEL]]) {
        assert!(out.len() <= GROUP && blocks.len() == out.len() * nb);
        assert!(a.qs.len() >= nb * PANEL && a.d.len() >= nb * PANEL);
        assert!(a.sub_block_sums.len() >= nb * SUB_BLOCK_PAIRS);
    }

    /// Super-block by super-block, for each weight row of the group: each 32-value group
    /// decoded once, then multiplied with the eight rows' activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel_rows_avx2(
        blocks: &[Q5KBlock],
        nb: usize,
        a: Q8KPanel<'_>,
        out: &mut [[f32; PANEL]],
    ) {
        check_sizes(blocks, nb, a, out);
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; GROUP];
        for b in 0..nb {
            // SAFETY (activation reads): super-block b of all eight rows, checked above.
            let qa = a.qs.as_ptr().add(b * PANEL) as *const i8;
            for (c, acc) in acc.iter_mut().enumerate().take(out.len()) {
                let blk = &blocks[c * nb + b];
                let mut sums = [_mm256_setzero_si256(); PANEL];
                // Shifted right by one per 32 values, so bit 0 of each byte is the next high
                // bit (16-bit shifts: what crosses from the upper byte lands above bit 0).
                let mut high = _mm256_loadu_si256(blk.qh.as_ptr() as *const __m256i);
                for g in 0..4 {
                    let raw = _mm256_loadu_si256(blk.qs.as_ptr().add(32 * g) as *const __m256i);
                    let lo = _mm256_or_si256(
                        _mm256_and_si256(raw, low),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(high, one)),
                    );
                    high = _mm256_srli_epi16::<1>(high);
                    let hi = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(high, one)),
                    );
                    high = _mm256_srli_epi16::<1>(high);
                    let s_lo = _mm256_set1_epi16(blk.scales[2 * g] as i16);
                    let s_hi = _mm256_set1_epi16(blk.scales[2 * g + 1] as i16);
                    rows_dot(&mut sums, lo, s_lo, qa.add(64 * g), QK_K);
                    rows_dot(&mut sums, hi, s_hi, qa.add(64 * g + 32), QK_K);
                }
                fold_super_block(acc, blk, a, b, sum_each(&sums));
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes(_mm256_sub_ps(acc[0], acc[1]));
        }
    }

    /// [`rows_dot128`]'s scale layout for values `64g0 .. 64g0 + 128`: its first 64 values
    /// are sub-blocks 2g0 (128-bit lanes 0, 1) and 2g0 + 1 (lanes 2, 3), the next 64 the two
    /// after.
    const fn scale_index(g0: usize) -> [i16; 32] {
        let mut index = [0i16; 32];
        let mut e = 0;
        while e < 32 {
            let (lane, p) = (e / 8, e % 8);
            index[e] = (2 * g0 + (lane >= 2) as usize + 2 * (p >= 4) as usize) as i16;
            e += 1;
        }
        index
    }

    const SCALE_INDEX: [[i16; 32]; 2] = [scale_index(0), scale_index(2)];

    /// As the AVX2 path, each 64-value group (two sub-blocks) in one 512-bit register, two
    /// groups per [`rows_dot128`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn panel_rows_avx512(
        blocks: &[Q5KBlock],
        nb: usize,
        a: Q8KPanel<'_>,
        out: &mut [[f32; PANEL]],
    ) {
        check_sizes(blocks, nb, a, out);
        let low = _mm512_set1_epi8(0x0F);
        let one = _mm512_set1_epi8(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; GROUP];
        for b in 0..nb {
            // SAFETY (activation reads): super-block b of all eight rows, checked above.
            let qa = a.qs.as_ptr().add(b * PANEL) as *const i8;
            for (c, acc) in acc.iter_mut().enumerate().take(out.len()) {
                let blk = &blocks[c * nb + b];
                let mut sums = [_mm512_setzero_si512(); PANEL];
                let scales = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                    blk.scales.as_ptr() as *const __m128i,
                )));
                let mut w = [_mm512_setzero_si512(); 2];
                // The high bits of sub-block 2g in the low half, of 2g + 1 in the upper half,
                // shifted right by two per 64 values (as in the AVX2 path, per byte).
                let qh = _mm256_loadu_si256(blk.qh.as_ptr() as *const __m256i);
                let mut high = join(qh, _mm256_srli_epi16::<1>(qh));
                for g in 0..4 {
                    let raw = _mm256_loadu_si256(blk.qs.as_ptr().add(32 * g) as *const __m256i);
                    w[g % 2] = _mm512_or_si512(
                        _mm512_and_si512(join(raw, _mm256_srli_epi16::<4>(raw)), low),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(high, one)),
                    );
                    high = _mm512_srli_epi16::<2>(high);
                    if g % 2 == 1 {
                        let scale = spread_scales(scales, &SCALE_INDEX[g / 2]);
                        rows_dot128(&mut sums, w, scale, qa.add(64 * (g - 1)), QK_K);
                    }
                }
                fold_super_block(acc, blk, a, b, sum_each512(&sums));
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = lanes(_mm256_sub_ps(acc[0], acc[1]));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{check_dequantization, check_matmul, random_f16};
    use super::*;
    use candle_core::quantized::GgmlDType;

    /// Random super-blocks: finite positive scales, random packed scales, mins and values.
    pub(crate) fn random_q5k(n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..n * k / QK_K {
            bytes.extend_from_slice(&random_f16(seed, 0.01));
            bytes.extend_from_slice(&random_f16(seed, 0.002));
            for _ in 4..Q5KBlock::FILE_BYTES {
                bytes.push(super::super::tests::random_byte(seed));
            }
        }
        bytes
    }

    /// Value `e` of a super-block by the GGUF definition, in f64.
    pub(crate) fn reference(blk: &[u8], e: usize) -> f64 {
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
        let byte = blk[48 + 32 * (e / 64) + e % 32];
        let low = if (e / 32).is_multiple_of(2) {
            byte & 15
        } else {
            byte >> 4
        };
        let q = low | (((blk[16 + e % 32] >> (e / 32)) & 1) << 4);
        d * scale as f64 * q as f64 - dmin * min as f64
    }

    #[test]
    fn matches_naive_reference_on_every_path_bit_for_bit() {
        check_matmul::<Q5KBlock>(random_q5k, reference);
    }

    #[test]
    fn dequantized_rows_equal_candles() {
        check_dequantization::<Q5KBlock>(GgmlDType::Q5K, random_q5k);
    }
}
