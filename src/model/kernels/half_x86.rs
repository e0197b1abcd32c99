//! The x86 micro-kernels of [`super`]: each performs [`super::accumulate_portable`]'s fused
//! multiply-adds in the same order per lane, only several lanes and outputs at a time. The
//! lane sums of weight row `c` live in `acc[c]` as `[panel row][8 lanes]`, which is also one
//! 512-bit register per pair of panel rows.

use super::{Job, LANES, PANEL};

/// Lane sums of one weight row against the eight panel rows.
type Lanes = [f32; PANEL * LANES];

pub(super) mod avx2 {
    use super::super::SumsOut;
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

    /// The sums of the eight rows of lanes, each as ggml's `hsum_float_8` orders it
    /// (`((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`), eight rows at once: the same additions as
    /// the scalar order, transposed.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn reduce(lanes: &Lanes) -> [f32; PANEL] {
        let v: [__m256; PANEL] =
            std::array::from_fn(|r| _mm256_loadu_ps(lanes.as_ptr().add(r * LANES)));
        let mut out = [0f32; PANEL];
        _mm256_storeu_ps(out.as_mut_ptr(), hsum8_x8(v));
        out
    }

    /// [`super::super::write_sums`]: eight weight rows at a time, their sums gathered across
    /// weight rows (the same additions as [`reduce`]) so that the eight outputs are
    /// neighbours in an output row; the last `acc.len() mod 8` rows by [`reduce`].
    ///
    /// # Safety
    /// The CPU must support AVX2; `dst` holds every output (checked by the caller).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn write_sums(acc: &[Lanes], live: usize, dst: SumsOut) {
        let at = |r: usize, c: usize| dst.out.at(dst.row0 + r, dst.col0 + c);
        let grouped = acc.len() / PANEL * PANEL;
        for c in (0..grouped).step_by(PANEL) {
            for r in 0..live {
                let v: [__m256; PANEL] =
                    std::array::from_fn(|i| _mm256_loadu_ps(acc[c + i].as_ptr().add(r * LANES)));
                _mm256_storeu_ps(at(r, c), hsum8_x8(v));
            }
        }
        for (c, lanes) in acc.iter().enumerate().skip(grouped) {
            let sums = reduce(lanes);
            for (r, &sum) in sums.iter().enumerate().take(live) {
                *at(r, c) = sum;
            }
        }
    }

    /// The eight vectors' sums of their lanes, in order, each as ggml's `hsum_float_8`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum8_x8(v: [__m256; PANEL]) -> __m256 {
        // [a0+a4, a1+a5, a2+a6, a3+a7] of rows r and r+1 in the two 128-bit halves.
        let fold = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        };
        let (t01, t23, t45, t67) = (
            fold(v[0], v[1]),
            fold(v[2], v[3]),
            fold(v[4], v[5]),
            fold(v[6], v[7]),
        );
        // [(a0+a4)+(a2+a6), (a1+a5)+(a3+a7)] of rows (0, 2 | 1, 3) and (4, 6 | 5, 7).
        let pair = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0x44>(a, b),
                _mm256_shuffle_ps::<0xEE>(a, b),
            )
        };
        let (s03, s47) = (pair(t01, t23), pair(t45, t67));
        // The two halves added: rows (0, 2, 4, 6 | 1, 3, 5, 7).
        let sums = _mm256_add_ps(
            _mm256_shuffle_ps::<0x88>(s03, s47),
            _mm256_shuffle_ps::<0xDD>(s03, s47),
        );
        _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
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
