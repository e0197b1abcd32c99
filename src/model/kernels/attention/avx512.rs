//! The AVX-512 paths of [`super`]: 16-lane versions of the AVX2 score kernel and a weighted
//! sum of values over a whole query group, each output element computed by the same chain of
//! operations as the portable definition.

use super::{kt_index, visible_lanes, Head, ValueGroup, KEY_LANES, KEY_TILE, QUERY_GROUP};
use std::arch::x86_64::*;

/// The AVX2 `scores` on 16-key zmm vectors: each score is still its own FMA chain over
/// the head dimension in order. Four vectors (64 keys) per query while the range allows:
/// sixteen independent chains, and half a load per FMA (two vectors: eight chains, three
/// quarters of a load per FMA). Each score is scaled as it is stored, and each query keeps
/// sixteen running maxima over its visible keys' scores (`maxps` ignores a NaN score: it
/// returns its second operand, the maximum so far, which is never NaN).
#[target_feature(enable = "avx512f,avx2,fma")]
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
    let mut group = Group {
        qrow: std::array::from_fn(|r| h.q.as_ptr().add((first + r.min(live - 1)) * d)),
        live,
        visible: std::array::from_fn(|r| h.visible(first + r)),
        scale: _mm512_set1_ps(h.scale),
        max: [_mm512_set1_ps(f32::NEG_INFINITY); QUERY_GROUP],
    };
    let mut j = keys.start;
    while j < keys.end {
        // SAFETY: the asserts above bound every read and write.
        if j + 8 * KEY_LANES <= keys.end {
            key_block::<4>(h, &mut group, j, scores);
            j += 8 * KEY_LANES;
        } else if j + 4 * KEY_LANES <= keys.end {
            key_block::<2>(h, &mut group, j, scores);
            j += 4 * KEY_LANES;
        } else {
            key_block::<1>(h, &mut group, j, scores);
            j += 2 * KEY_LANES;
        }
    }
    for (m, &lanes) in maxima.iter_mut().zip(&group.max).take(live) {
        *m = m.max(_mm512_reduce_max_ps(lanes));
    }
}

/// A query group of [`scores`]: its queries' rows (rows past `live` repeat the last query;
/// their scores are not used), visible keys, the scale and the running maxima.
struct Group {
    qrow: [*const f32; QUERY_GROUP],
    live: usize,
    visible: [std::ops::Range<usize>; QUERY_GROUP],
    scale: __m512,
    max: [__m512; QUERY_GROUP],
}

/// [`super::weighted_values`] 64 columns (four vectors) at a time for the four queries:
/// sixteen independent FMA chains, continued from `out`, and each `v_j` vector loaded once for
/// the group.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weighted_values(
    g: &ValueGroup<'_>,
    keys: std::ops::Range<usize>,
    v: &[f32],
    d: usize,
    out: &mut [f32],
) {
    for c0 in (0..d).step_by(64) {
        // SAFETY: c0 + 16·V ≤ d; keys < g.keys.end, whose rows `v` holds (the caller's assert).
        let keys = keys.clone();
        match (d - c0) / 16 {
            1 => columns::<1>(g, keys, v, (d, c0), out),
            2 => columns::<2>(g, keys, v, (d, c0), out),
            3 => columns::<3>(g, keys, v, (d, c0), out),
            _ => columns::<4>(g, keys, v, (d, c0), out),
        }
    }
}

/// Output columns `c0..c0 + 16·V` of the group's queries, their chains continued over `keys`.
#[target_feature(enable = "avx512f")]
unsafe fn columns<const V: usize>(
    g: &ValueGroup<'_>,
    keys: std::ops::Range<usize>,
    v: &[f32],
    (d, c0): (usize, usize),
    out: &mut [f32],
) {
    let mut acc = [[_mm512_setzero_ps(); V]; QUERY_GROUP];
    for (r, acc_r) in acc.iter_mut().enumerate().take(g.live) {
        let o = out.as_ptr().add(r * d + c0);
        for (c, a) in acc_r.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(o.add(16 * c));
        }
    }
    // The keys every query of a full group sees run without a per-query range check (the
    // bulk of a causal row); the edges with it. Either way each chain takes its keys in order.
    let bulk = g.shared_keys(&keys);
    let step = |acc: &mut [[__m512; V]; QUERY_GROUP], j: usize, checked: bool| {
        let row = v.as_ptr().add(j * d + c0);
        let vj: [__m512; V] = std::array::from_fn(|c| _mm512_loadu_ps(row.add(16 * c)));
        for (r, acc_r) in acc.iter_mut().enumerate().take(g.live) {
            if !checked || (g.start[r]..g.end[r]).contains(&j) {
                let p = _mm512_set1_ps(*g.probs[r].get_unchecked(j - g.start[r]));
                for (a, x) in acc_r.iter_mut().zip(&vj) {
                    *a = _mm512_fmadd_ps(p, *x, *a);
                }
            }
        }
    };
    for j in keys.start..bulk.start {
        step(&mut acc, j, true);
    }
    for j in bulk.clone() {
        step(&mut acc, j, false);
    }
    for j in bulk.end..keys.end {
        step(&mut acc, j, true);
    }
    for (r, acc_r) in acc.iter().enumerate().take(g.live) {
        let o = out.as_mut_ptr().add(r * d + c0);
        for (c, a) in acc_r.iter().enumerate() {
            _mm512_storeu_ps(o.add(16 * c), *a);
        }
    }
}

/// Scaled scores of the group for the `16·V` keys from `j`, and its maxima raised.
#[target_feature(enable = "avx512f")]
unsafe fn key_block<const V: usize>(h: &Head<'_>, g: &mut Group, j: usize, scores: &mut [f32]) {
    let (d, cols) = (h.d, h.cols);
    // Tile `v` holds keys `j + 16·v ..` (16 = KEY_TILE: one vector per row of a tile).
    let tiles: [*const f32; V] =
        std::array::from_fn(|v| h.kt.as_ptr().add(kt_index(d, j + KEY_TILE * v, 0)));
    let mut acc = [[_mm512_setzero_ps(); V]; QUERY_GROUP];
    for dd in 0..d {
        let k: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(tiles[v].add(dd * KEY_TILE)));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let qv = _mm512_set1_ps(*g.qrow[r].add(dd));
            for (a, kv) in acc_r.iter_mut().zip(&k) {
                *a = _mm512_fmadd_ps(qv, *kv, *a);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate().take(g.live) {
        let out = scores.as_mut_ptr().add(r * cols + j);
        for (v, a) in acc_r.iter().enumerate() {
            let x = _mm512_mul_ps(*a, g.scale);
            _mm512_storeu_ps(out.add(16 * v), x);
            let lanes = visible_lanes(j + 16 * v, 16, &g.visible[r]) as __mmask16;
            g.max[r] = _mm512_mask_max_ps(g.max[r], lanes, x, g.max[r]);
        }
    }
}

/// [`super::divide`] on sixteen lanes (`vdivps` rounds each quotient as the scalar division
/// does).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn divide(row: &mut [f32], divisor: f32) {
    let dv = _mm512_set1_ps(divisor);
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        _mm512_storeu_ps(
            c.as_mut_ptr(),
            _mm512_div_ps(_mm512_loadu_ps(c.as_ptr()), dv),
        );
    }
    for s in chunks.into_remainder() {
        *s /= divisor;
    }
}
