//! The x86 micro-kernels of [`super`]: each performs [`super::accumulate_portable`]'s fused
//! multiply-adds in the same order per lane, only several lanes and outputs at a time. The
//! lane sums of weight row `c` live in `acc[c]` as `[panel row][8 lanes]`, which is also one
//! 512-bit register per pair of panel rows.

use super::{Job, LANES, PANEL};

/// Lane sums of one weight row against the eight panel rows.
type Lanes = [f32; PANEL * LANES];

pub(super) mod avx2 {
    use super::{Job, Lanes, LANES, PANEL};
    use crate::model::kernels::half_driver::x86::{store256, sums256};
    use std::arch::x86_64::*;

    /// Panel rows per register tile (a panel is two halves).
    const ROWS: usize = 4;

    /// Eight weights widened to f32: F16 by the F16C conversion, BF16 by a 16-bit shift.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen8<const BF16: bool>(p: *const u16) -> __m256 {
        let raw = _mm_loadu_si128(p as *const __m128i);
        if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
        } else {
            _mm256_cvtph_ps(raw)
        }
    }

    /// `C` weight rows from row `c0` × panel rows `4h..4h+4` over the job's chunks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const BF16: bool, const C: usize>(
        job: &Job<'_>,
        c0: usize,
        h: usize,
        acc: &mut [Lanes],
    ) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        let x = job.panel.chunks.as_ptr().add(h * ROWS * LANES);
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums256::<ROWS, C>(acc, c0, h * ROWS, job.chunks.start > 0);
        let mut wv = [_mm256_setzero_ps(); C];
        for ch in job.chunks.clone() {
            for (i, v) in wv.iter_mut().enumerate() {
                *v = widen8::<BF16>(w.add(i * k + ch * LANES));
            }
            for (r, sums_r) in sums.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add((ch * PANEL + r) * LANES));
                for (s, v) in sums_r.iter_mut().zip(&wv) {
                    *s = _mm256_fmadd_ps(*v, xv, *s);
                }
            }
        }
        store256(acc, c0, h * ROWS, &sums);
    }

    /// Every weight row of the job, three at a time, over the panel's live halves.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `acc` holds one entry per weight row and the
    /// panel the job's chunks (checked by the caller).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn accumulate(bf16: bool, job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        for h in 0..job.live.div_ceil(ROWS) {
            let mut c0 = 0;
            while c0 < rows {
                match (bf16, rows - c0) {
                    (false, 3..) => tile::<false, 3>(job, c0, h, acc),
                    (true, 3..) => tile::<true, 3>(job, c0, h, acc),
                    (false, 2) => tile::<false, 2>(job, c0, h, acc),
                    (true, 2) => tile::<true, 2>(job, c0, h, acc),
                    (false, _) => tile::<false, 1>(job, c0, h, acc),
                    (true, _) => tile::<true, 1>(job, c0, h, acc),
                }
                c0 += (rows - c0).min(3);
            }
        }
    }

    /// Eight values rounded to F16 or BF16 (nearest even; NaNs made quiet), as f32: the same
    /// bits as [`super::super::HalfType::round`].
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn round8(bf16: bool, src: &[f32], dst: &mut [f32]) {
        assert!(src.len() == LANES && dst.len() == LANES);
        let v = _mm256_loadu_ps(src.as_ptr());
        let r = if bf16 {
            let u = _mm256_castps_si256(v);
            let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(1));
            let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);
            let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
            let rounded = _mm256_and_si256(_mm256_add_epi32(u, bias), high);
            let quiet = _mm256_or_si256(_mm256_and_si256(u, high), _mm256_set1_epi32(0x0040_0000));
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan))
        } else {
            _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        };
        _mm256_storeu_ps(dst.as_mut_ptr(), r);
    }
}

pub(super) mod avx512 {
    use super::{Job, Lanes, LANES, PANEL};
    use crate::model::kernels::half_driver::x86::{store512, sums512};
    use std::arch::x86_64::*;

    /// Eight weights widened to f32, in both halves of the register.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn widen8x2<const BF16: bool>(p: *const u16) -> __m512 {
        let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        if BF16 {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
        } else {
            _mm512_cvtph_ps(raw)
        }
    }

    /// `C` weight rows from row `c0` × the eight panel rows over the job's chunks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn tile<const BF16: bool, const C: usize>(job: &Job<'_>, c0: usize, acc: &mut [Lanes]) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        let x = job.panel.chunks.as_ptr();
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums512::<C>(acc, c0, job.chunks.start > 0);
        let mut wv = [_mm512_setzero_ps(); C];
        for ch in job.chunks.clone() {
            for (i, v) in wv.iter_mut().enumerate() {
                *v = widen8x2::<BF16>(w.add(i * k + ch * LANES));
            }
            for (q, sums_q) in sums.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add((ch * PANEL + 2 * q) * LANES));
                for (s, v) in sums_q.iter_mut().zip(&wv) {
                    *s = _mm512_fmadd_ps(*v, xv, *s);
                }
            }
        }
        store512(acc, c0, &sums);
    }

    /// Every weight row of the job, four at a time, over the whole panel.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C; `acc` holds one entry per
    /// weight row and the panel the job's chunks (checked by the caller).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(in super::super) unsafe fn accumulate(bf16: bool, job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        let mut c0 = 0;
        while c0 < rows {
            match (bf16, rows - c0) {
                (false, 4..) => tile::<false, 4>(job, c0, acc),
                (true, 4..) => tile::<true, 4>(job, c0, acc),
                (false, 3) => tile::<false, 3>(job, c0, acc),
                (true, 3) => tile::<true, 3>(job, c0, acc),
                (false, 2) => tile::<false, 2>(job, c0, acc),
                (true, 2) => tile::<true, 2>(job, c0, acc),
                (false, _) => tile::<false, 1>(job, c0, acc),
                (true, _) => tile::<true, 1>(job, c0, acc),
            }
            c0 += (rows - c0).min(4);
        }
    }
}
