//! The AVX2 and FMA paths of [`super`]: the same operations per element as the portable
//! definition, eight lanes at a time.

use super::{kt_index, visible_lanes, Head, ValueGroup, KEY_LANES, KEY_TILE, QUERY_GROUP};
use std::arch::x86_64::*;

/// Scores of up to four queries against 16 keys at a time: per head dimension one load
/// of each 8-key vector of `Kᵀ`, one broadcast per query, eight FMAs; then the scale and
/// the running maxima over the visible keys (eight lanes each, NaN ignored as `maxps`
/// keeps its second operand, the maximum so far, never NaN).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores(
    h: &Head<'_>,
    first: usize,
    live: usize,
    keys: std::ops::Range<usize>,
    scores: &mut [f32],
    maxima: &mut [f32],
) {
    let (d, cols) = (h.d, h.cols);
    assert!(keys.end <= cols && keys.start.is_multiple_of(2 * KEY_LANES));
    assert!((keys.end - keys.start).is_multiple_of(2 * KEY_LANES));
    assert!(h.q.len() >= (first + live) * d && h.kt.len() >= d * cols);
    assert!(live <= QUERY_GROUP && scores.len() >= QUERY_GROUP * cols);
    // Rows past `live` repeat the last query (their scores are not used).
    let qrow: [*const f32; QUERY_GROUP] =
        std::array::from_fn(|r| h.q.as_ptr().add((first + r.min(live - 1)) * d));
    let kt = h.kt.as_ptr();
    let scale = _mm256_set1_ps(h.scale);
    let none = _mm256_set1_ps(f32::NEG_INFINITY);
    let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let visible: [_; QUERY_GROUP] = std::array::from_fn(|r| h.visible(first + r));
    let mut max = [none; QUERY_GROUP];
    for j in keys.step_by(2 * KEY_LANES) {
        let mut acc = [[_mm256_setzero_ps(); 2]; QUERY_GROUP];
        let tile = kt.add(kt_index(d, j, 0));
        for dd in 0..d {
            let k0 = _mm256_loadu_ps(tile.add(dd * KEY_TILE));
            let k1 = _mm256_loadu_ps(tile.add(dd * KEY_TILE + KEY_LANES));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let qv = _mm256_broadcast_ss(&*qrow[r].add(dd));
                acc_r[0] = _mm256_fmadd_ps(qv, k0, acc_r[0]);
                acc_r[1] = _mm256_fmadd_ps(qv, k1, acc_r[1]);
            }
        }
        for (r, acc_r) in acc.iter().enumerate().take(live) {
            let out = scores.as_mut_ptr().add(r * cols + j);
            for (v, a) in acc_r.iter().enumerate() {
                let x = _mm256_mul_ps(*a, scale);
                _mm256_storeu_ps(out.add(v * KEY_LANES), x);
                let bits = visible_lanes(j + v * KEY_LANES, KEY_LANES, &visible[r]);
                let keep = _mm256_cmpeq_epi32(
                    _mm256_and_si256(_mm256_set1_epi32(bits as i32), lane_bits),
                    lane_bits,
                );
                max[r] =
                    _mm256_max_ps(_mm256_blendv_ps(none, x, _mm256_castsi256_ps(keep)), max[r]);
            }
        }
    }
    for (r, m) in max.iter().enumerate().take(live) {
        let mut lanes = [0f32; KEY_LANES];
        _mm256_storeu_ps(lanes.as_mut_ptr(), *m);
        maxima[r] = lanes.iter().fold(maxima[r], |a, &l| a.max(l));
    }
}

/// [`super::weighted_values`] 16 columns (two vectors) at a time for the four queries:
/// eight independent FMA chains, and each `v_j` vector loaded once for the group.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_values(
    g: &ValueGroup<'_>,
    keys: std::ops::Range<usize>,
    v: &[f32],
    d: usize,
    out: &mut [f32],
) {
    for c0 in (0..d).step_by(16) {
        // SAFETY: c0 + 8·V ≤ d; keys < g.keys.end, whose rows `v` holds (the caller's
        // assert).
        if d - c0 >= 16 {
            columns::<2>(g, keys.clone(), v, (d, c0), out);
        } else {
            columns::<1>(g, keys.clone(), v, (d, c0), out);
        }
    }
}

/// [`super::divide`] on eight lanes (`vdivps` rounds each quotient as the scalar division
/// does; the compiler's own loop divided four at a time, half of the softmax's time).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn divide(row: &mut [f32], divisor: f32) {
    let dv = _mm256_set1_ps(divisor);
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(
            c.as_mut_ptr(),
            _mm256_div_ps(_mm256_loadu_ps(c.as_ptr()), dv),
        );
    }
    for s in chunks.into_remainder() {
        *s /= divisor;
    }
}

/// Output columns `c0..c0 + 8·V` of the group's queries, their chains continued over
/// `keys`: the keys every query of a full group sees without a test per query and key
/// (the tests were most of the instructions: this pass ran at half the speed of the
/// score pass, which does the same multiply-adds), the others with it.
#[target_feature(enable = "avx2,fma")]
unsafe fn columns<const V: usize>(
    g: &ValueGroup<'_>,
    keys: std::ops::Range<usize>,
    v: &[f32],
    (d, c0): (usize, usize),
    out: &mut [f32],
) {
    let mut acc = [[_mm256_setzero_ps(); V]; QUERY_GROUP];
    for (r, acc_r) in acc.iter_mut().enumerate().take(g.live) {
        let o = out.as_ptr().add(r * d + c0);
        for (c, a) in acc_r.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(o.add(8 * c));
        }
    }
    let shared = g.shared_keys(&keys);
    for j in keys.start..shared.start {
        key_step::<V>(g, j, v.as_ptr().add(j * d + c0), &mut acc);
    }
    if !shared.is_empty() {
        let probs = std::array::from_fn(|r| g.probs[r].as_ptr().add(shared.start - g.start[r]));
        let row = v.as_ptr().add(shared.start * d + c0);
        shared_span(&mut acc, probs, (row, d), shared.len());
    }
    for j in shared.end..keys.end {
        key_step::<V>(g, j, v.as_ptr().add(j * d + c0), &mut acc);
    }
    for (r, acc_r) in acc.iter().enumerate().take(g.live) {
        let o = out.as_mut_ptr().add(r * d + c0);
        for (c, a) in acc_r.iter().enumerate() {
            _mm256_storeu_ps(o.add(8 * c), *a);
        }
    }
}

/// `keys` consecutive keys that every query of the group sees: query `r`'s probabilities
/// from `probs[r]`, the keys' value rows (their columns of the tile) from `row`, `d`
/// apart. Not inlined, so that its pointers stay in registers (inlined, three of the four
/// probability pointers were reloaded from the stack at every key).
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn shared_span<const V: usize>(
    acc: &mut [[__m256; V]; QUERY_GROUP],
    probs: [*const f32; QUERY_GROUP],
    (mut row, d): (*const f32, usize),
    keys: usize,
) {
    let mut sums = *acc;
    for j in 0..keys {
        let vj: [__m256; V] = std::array::from_fn(|c| _mm256_loadu_ps(row.add(8 * c)));
        for (sums_r, p) in sums.iter_mut().zip(&probs) {
            let p = _mm256_broadcast_ss(&*p.add(j));
            for (a, x) in sums_r.iter_mut().zip(&vj) {
                *a = _mm256_fmadd_ps(p, *x, *a);
            }
        }
        row = row.add(d);
    }
    *acc = sums;
}

/// Key `j`'s products (its value row's columns at `row`) added into the chains of the
/// group's queries that see it.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn key_step<const V: usize>(
    g: &ValueGroup<'_>,
    j: usize,
    row: *const f32,
    acc: &mut [[__m256; V]; QUERY_GROUP],
) {
    let vj: [__m256; V] = std::array::from_fn(|c| _mm256_loadu_ps(row.add(8 * c)));
    for (r, acc_r) in acc.iter_mut().enumerate().take(g.live) {
        if (g.start[r]..g.end[r]).contains(&j) {
            let p = _mm256_set1_ps(*g.probs[r].get_unchecked(j - g.start[r]));
            for (a, x) in acc_r.iter_mut().zip(&vj) {
                *a = _mm256_fmadd_ps(p, *x, *a);
            }
        }
    }
}
