//! The x86 micro-kernels of [`super`]: each performs the module's defined operations per
//! output lane (the same fused multiply-adds in the same order as
//! [`super::dot_portable`]), only several outputs at a time.

use super::{PanelRef, LANES, PANEL};

/// One call's operands: `w` holds the group's weight rows back to back (`k` values each).
pub(super) struct Job<'a> {
    pub bf16: bool,
    pub w: &'a [u16],
    pub k: usize,
    pub panel: PanelRef<'a>,
    /// Rows of the panel that hold activations.
    pub live: usize,
}

impl Job<'_> {
    /// Adds the `k mod 8` tail products of weight row `c` and panel row `r` to `s` (the
    /// definition's last step), one at a time.
    #[inline]
    fn finish(&self, s: f32, c: usize, r: usize) -> f32 {
        let tail = self.k % LANES;
        if tail == 0 {
            return s;
        }
        let kind = if self.bf16 {
            super::HalfType::Bf16
        } else {
            super::HalfType::F16
        };
        let w = &self.w[c * self.k + self.k - tail..][..tail];
        let x = &self.panel.tail[r * tail..][..tail];
        w.iter()
            .zip(x)
            .fold(s, |s, (&w, &x)| kind.widen(w).mul_add(x, s))
    }

    fn check(&self, groups: usize) {
        assert!(self.w.len() == groups * self.k);
        assert!(self.panel.chunks.len() >= self.k / LANES * PANEL * LANES);
        assert!(self.panel.tail.len() >= PANEL * (self.k % LANES));
    }
}

pub(super) mod avx2 {
    use super::super::{LANES, PANEL};
    use super::super::super::hsum256;
    use super::Job;
    use std::arch::x86_64::*;

    /// Panel rows per register tile (the panel is two halves).
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

    /// `C` weight rows (from `w`, `k` apart) × four panel rows (from `x`) over `chunks`
    /// chunks: `acc[r][c]` holds the eight lane sums.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const BF16: bool, const C: usize>(
        w: *const u16,
        k: usize,
        x: *const f32,
        chunks: usize,
    ) -> [[__m256; C]; ROWS] {
        let mut acc = [[_mm256_setzero_ps(); C]; ROWS];
        let mut wv = [_mm256_setzero_ps(); C];
        for c in 0..chunks {
            for (i, v) in wv.iter_mut().enumerate() {
                *v = widen8::<BF16>(w.add(i * k + c * LANES));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add((c * PANEL + r) * LANES));
                for (a, v) in acc_r.iter_mut().zip(&wv) {
                    *a = _mm256_fmadd_ps(*v, xv, *a);
                }
            }
        }
        acc
    }

    /// Weight rows `c0..c0+C` of the job into `out[c][..]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const BF16: bool, const C: usize>(
        job: &Job<'_>,
        c0: usize,
        out: &mut [[f32; PANEL]],
    ) {
        let chunks = job.k / LANES;
        let w = job.w.as_ptr().add(c0 * job.k);
        for half in 0..job.live.div_ceil(ROWS) {
            let x = job.panel.chunks.as_ptr().add(half * ROWS * LANES);
            let acc = tile::<BF16, C>(w, job.k, x, chunks);
            for (r, acc_r) in acc.iter().enumerate() {
                let row = half * ROWS + r;
                for (c, a) in acc_r.iter().enumerate() {
                    out[c0 + c][row] = job.finish(hsum256(*a), c0 + c, row);
                }
            }
        }
    }

    /// Every weight row of the job against the panel: `out[c][r]`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_group(job: &Job<'_>, out: &mut [[f32; PANEL]]) {
        let rows = out.len();
        job.check(rows);
        let mut c0 = 0;
        while c0 < rows {
            // SAFETY: rows c0.. exist (checked lengths above).
            match (job.bf16, rows - c0) {
                (false, 3..) => group::<false, 3>(job, c0, out),
                (true, 3..) => group::<true, 3>(job, c0, out),
                (false, 2) => group::<false, 2>(job, c0, out),
                (true, 2) => group::<true, 2>(job, c0, out),
                (false, _) => group::<false, 1>(job, c0, out),
                (true, _) => group::<true, 1>(job, c0, out),
            }
            c0 += (rows - c0).min(3);
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
            let quiet = _mm256_or_si256(
                _mm256_and_si256(u, high),
                _mm256_set1_epi32(0x0040_0000),
            );
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan))
        } else {
            _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        };
        _mm256_storeu_ps(dst.as_mut_ptr(), r);
    }
}

pub(super) mod avx512 {
    use super::super::{LANES, PANEL};
    use super::super::super::hsum256;
    use super::Job;
    use std::arch::x86_64::*;

    /// Pairs of panel rows per register tile: each 512-bit accumulator holds row `2q`'s eight
    /// lanes in its low half and row `2q+1`'s in its high half.
    const PAIRS: usize = PANEL / 2;

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

    /// `C` weight rows × the eight panel rows over `chunks` chunks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn tile<const BF16: bool, const C: usize>(
        w: *const u16,
        k: usize,
        x: *const f32,
        chunks: usize,
    ) -> [[__m512; C]; PAIRS] {
        let mut acc = [[_mm512_setzero_ps(); C]; PAIRS];
        let mut wv = [_mm512_setzero_ps(); C];
        for c in 0..chunks {
            for (i, v) in wv.iter_mut().enumerate() {
                *v = widen8x2::<BF16>(w.add(i * k + c * LANES));
            }
            for (q, acc_q) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add((c * PANEL + 2 * q) * LANES));
                for (a, v) in acc_q.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(*v, xv, *a);
                }
            }
        }
        acc
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn group<const BF16: bool, const C: usize>(
        job: &Job<'_>,
        c0: usize,
        out: &mut [[f32; PANEL]],
    ) {
        let w = job.w.as_ptr().add(c0 * job.k);
        let acc = tile::<BF16, C>(w, job.k, job.panel.chunks.as_ptr(), job.k / LANES);
        for (q, acc_q) in acc.iter().enumerate().take(job.live.div_ceil(2)) {
            for (c, a) in acc_q.iter().enumerate() {
                let low = _mm512_castps512_ps256(*a);
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
                out[c0 + c][2 * q] = job.finish(hsum256(low), c0 + c, 2 * q);
                out[c0 + c][2 * q + 1] = job.finish(hsum256(high), c0 + c, 2 * q + 1);
            }
        }
    }

    /// Every weight row of the job against the panel: `out[c][r]`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(in super::super) unsafe fn row_group(job: &Job<'_>, out: &mut [[f32; PANEL]]) {
        let rows = out.len();
        job.check(rows);
        let mut c0 = 0;
        while c0 < rows {
            match (job.bf16, rows - c0) {
                (false, 4..) => group::<false, 4>(job, c0, out),
                (true, 4..) => group::<true, 4>(job, c0, out),
                (false, 3) => group::<false, 3>(job, c0, out),
                (true, 3) => group::<true, 3>(job, c0, out),
                (false, 2) => group::<false, 2>(job, c0, out),
                (true, 2) => group::<true, 2>(job, c0, out),
                (false, _) => group::<false, 1>(job, c0, out),
                (true, _) => group::<true, 1>(job, c0, out),
            }
            c0 += (rows - c0).min(4);
        }
    }
}
