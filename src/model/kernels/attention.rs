//! Causal (optionally sliding-window) attention of f32 heads in one pass: scores, softmax and
//! the weighted sum of values, computing only the visible keys of each query.
//!
//! Why: through candle's tensor ops a layer materialised four `[heads, t, t]` f32 tensors
//! (scores, scaled, masked, probabilities), took an exponential of every masked score too and
//! multiplied half-zero matrices; at t = 512 that was about a fifth of a SmolLM2 evaluation.
//! Here a query sees only keys `j ≤ i` (and `i − j < window`), nothing of size `t²` is stored,
//! and the exponential is a vectorised polynomial ([`super::math::exp`]).
//!
//! Float order is fixed per output element, independent of threads, of the batch and of how
//! queries are grouped: a score is one fused multiply-add chain over the head dimension in
//! index order, times the scale; the softmax subtracts the row's max, sums the exponentials
//! in key order and divides; an output element is one fused multiply-add chain over the keys
//! in order. The AVX2 and AVX-512 paths (the latter also runs the weighted sums of a group of
//! four queries together: independent chains, so they overlap) and the portable fallback
//! perform the same operations per element and give the same bits.

use rayon::prelude::*;

/// Queries per parallel task (tasks are (sequence, head, query block)).
const QUERY_BLOCK: usize = 32;
/// Keys per block of the score and value passes: a block of `Kᵀ` or `V` (32 KiB for 64-value
/// heads) stays in L1 while the task's query groups pass over it.
const KEY_BLOCK: usize = 128;

thread_local! {
    /// A task's scores `[QUERY_BLOCK][cols]`, kept per thread (1 MiB at t = 8192): written by
    /// the score pass before anything reads them.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A task's outputs `[QUERY_BLOCK][d]`, before they are copied to their rows.
    static OUTPUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `keys` in blocks of [`KEY_BLOCK`] (aligned to it).
fn key_blocks(keys: std::ops::Range<usize>) -> impl Iterator<Item = std::ops::Range<usize>> {
    let end = keys.end;
    (keys.start / KEY_BLOCK * KEY_BLOCK..end)
        .step_by(KEY_BLOCK)
        .map(move |b| b..(b + KEY_BLOCK).min(end))
}
/// Queries whose scores are computed together (they share each key load).
const QUERY_GROUP: usize = 4;
/// Keys per score vector; key columns are padded to a multiple of `2·KEY_LANES`.
const KEY_LANES: usize = 8;
/// Keys per tile of `Kᵀ`: a tile holds its keys' `d` rows of [`KEY_TILE`] values back to
/// back (4 KiB for 64-value heads), so that a score kernel reads it as one stream. A
/// row-major `Kᵀ` (`d` rows of `t` values) put the rows a power of two apart for power-of-two
/// contexts: at t = 4096–8192 the 64 rows a kernel reads together fell into the same cache
/// sets of L1 and L2, and long-context attention ran from L3 at a tenth of its speed.
const KEY_TILE: usize = 2 * KEY_LANES;

/// Where `Kᵀ[dd][j]` (value `dd` of key `j`) lies in the tiled layout of a head of size `d`.
#[inline(always)]
fn kt_index(d: usize, j: usize, dd: usize) -> usize {
    ((j / KEY_TILE) * d + dd) * KEY_TILE + j % KEY_TILE
}

/// Shapes of one attention call: `batch` sequences of `t` positions, `heads` query heads
/// sharing `kv_heads` key/value heads (grouped-query attention), `head_dim` values per head.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub t: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    /// Values in `q` (and in the output).
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.t * self.head_dim
    }

    /// Values in `k`, and in `v`.
    pub fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * self.t * self.head_dim
    }
}

/// `q [batch, heads, t, d]`, `k`/`v [batch, kv_heads, t, d]` (contiguous) → `[batch, t,
/// heads·d]`: position `i` attends to the positions `j ≤ i` with `i − j < window`.
pub fn causal_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttentionShape,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    causal_attention_with(super::isa(), (q, k, v), shape, scale, window)
}

/// [`causal_attention`] at instruction-set level `isa`, lowered to what this process may use
/// (every level gives the same bits; tests run each).
fn causal_attention_with(
    isa: super::Isa,
    (q, k, v): (&[f32], &[f32], &[f32]),
    shape: AttentionShape,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let isa = isa.min(super::isa());
    let AttentionShape {
        batch,
        heads,
        kv_heads,
        t,
        head_dim: d,
    } = shape;
    assert!(heads > 0 && kv_heads > 0 && heads.is_multiple_of(kv_heads));
    assert_eq!(q.len(), shape.q_len(), "q shape");
    assert_eq!(k.len(), shape.kv_len(), "k shape");
    assert_eq!(v.len(), k.len(), "v shape");
    let window = window.unwrap_or(usize::MAX).max(1);
    // K transposed per (sequence, kv head), in tiles of keys ([`kt_index`]), zero-padded
    // to whole tiles.
    let cols = t.div_ceil(2 * KEY_LANES) * 2 * KEY_LANES;
    let mut kt = vec![0f32; batch * kv_heads * d * cols];
    kt.par_chunks_mut(d * cols)
        .zip(k.par_chunks(t * d))
        .for_each(|(kt, k)| {
            for (j, row) in k.chunks_exact(d).enumerate() {
                for (dd, &x) in row.iter().enumerate() {
                    kt[kt_index(d, j, dd)] = x;
                }
            }
        });
    // Each task computes its block of queries into a buffer of its thread and copies the
    // rows to their places in `[batch, t, heads·d]` (an intermediate `[batch, heads, t, d]`
    // output, zeroed, then interleaved by a second pass, was a seventh of the attention time
    // in zeroing, page faults and copying).
    let len = batch * heads * t * d;
    let mut y: Vec<f32> = Vec::with_capacity(len);
    let rows = RowsOut(y.as_mut_ptr());
    let rep = heads / kv_heads;
    (0..batch * heads).into_par_iter().for_each(|bh| {
        let (b, h) = (bh / heads, bh % heads);
        let kv = b * kv_heads + h / rep;
        let head = Head {
            q: &q[bh * t * d..][..t * d],
            kt: &kt[kv * d * cols..][..d * cols],
            v: &v[kv * t * d..][..t * d],
            d,
            cols,
            scale,
            window,
            isa,
        };
        (0..t.div_ceil(QUERY_BLOCK))
            .into_par_iter()
            .for_each(|blk| {
                let i0 = blk * QUERY_BLOCK;
                let n = QUERY_BLOCK.min(t - i0);
                OUTPUT.with(|buffer| {
                    let mut buffer = buffer.borrow_mut();
                    buffer.resize(QUERY_BLOCK * d, 0.0);
                    let out = &mut buffer[..n * d];
                    head.queries(i0, out);
                    for (i, row) in out.chunks_exact(d).enumerate() {
                        let at = ((b * t + i0 + i) * heads + h) * d;
                        // SAFETY: `at + d ≤ len`, and each (sequence, position, head) row is
                        // written by exactly one task, once: the writes are disjoint.
                        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), rows.at(at), d) };
                    }
                });
            });
    });
    // SAFETY: every row of every (sequence, position, head) was written above, `len` values.
    unsafe { y.set_len(len) };
    y
}

/// The output's start, shared by the tasks that write its disjoint rows.
struct RowsOut(*mut f32);

// SAFETY: the tasks write disjoint rows through it (see `causal_attention_with`), and the
// buffer outlives them.
unsafe impl Sync for RowsOut {}

impl RowsOut {
    /// The pointer `at` values in (a method, so that closures capture the whole wrapper).
    fn at(&self, at: usize) -> *mut f32 {
        self.0.wrapping_add(at)
    }
}

/// One (sequence, head): its queries, its KV head's transposed keys and values.
struct Head<'a> {
    q: &'a [f32],
    kt: &'a [f32],
    v: &'a [f32],
    d: usize,
    cols: usize,
    scale: f32,
    window: usize,
    /// The level the kernels run at, at most [`super::isa`].
    isa: super::Isa,
}

impl Head<'_> {
    /// Outputs of the queries `i0..i0 + out.len()/d` into `out`, in three passes over the
    /// block's keys: scores, softmax, weighted values. The first and last run key block by key
    /// block with the block's query groups inside, so a block of `Kᵀ` or `V` is read from
    /// memory once for all of them and then from L1 (query group by query group, every group
    /// streamed the head's whole `Kᵀ` and `V`, up to 2 MiB each at t = 8192, from L3). The
    /// loops are only reordered: each score is still one chain over the head dimension, and
    /// each output element's chain over the keys is paused at a block's end with its value in
    /// `out` and resumed there, so every value is the same.
    fn queries(&self, i0: usize, out: &mut [f32]) {
        let d = self.d;
        let n = out.len() / d;
        SCORES.with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            if buffer.len() < QUERY_BLOCK * self.cols {
                buffer.resize(QUERY_BLOCK * self.cols, 0.0);
            }
            let scores = &mut buffer[..n.div_ceil(QUERY_GROUP) * QUERY_GROUP * self.cols];
            let groups = (0..n).step_by(QUERY_GROUP).map(|g0| {
                let (first, live) = (i0 + g0, QUERY_GROUP.min(n - g0));
                // Keys any query of the group sees, rounded out to whole vectors.
                let lo = (first + 1).saturating_sub(self.window) / (2 * KEY_LANES);
                let hi = (first + live).div_ceil(2 * KEY_LANES);
                (first, live, lo * 2 * KEY_LANES..hi * 2 * KEY_LANES)
            });
            let groups: Vec<_> = groups.collect();
            let all = groups[0].2.start..groups[groups.len() - 1].2.end;
            // Each query's largest scaled score over its visible keys, found as they are stored.
            let mut maxima = [f32::NEG_INFINITY; QUERY_BLOCK];
            for block in key_blocks(all.clone()) {
                for ((&(first, live, ref keys), rows), maxima) in groups
                    .iter()
                    .zip(scores.chunks_mut(QUERY_GROUP * self.cols))
                    .zip(maxima.chunks_mut(QUERY_GROUP))
                {
                    let keys = keys.start.max(block.start)..keys.end.min(block.end);
                    if !keys.is_empty() {
                        self.scores(first, live, keys, rows, maxima);
                    }
                }
            }
            out.fill(0.0);
            // Each query's visible keys (the rows of a group's absent queries stay unused).
            let mut visible: Vec<&mut [f32]> = scores
                .chunks_mut(self.cols)
                .take(n)
                .enumerate()
                .map(|(r, row)| &mut row[self.visible(i0 + r)])
                .collect();
            softmax_rows(self.isa, &mut visible, &maxima[..n]);
            let mut probs = visible.into_iter().map(|row| &*row);
            let value_groups: Vec<ValueGroup<'_>> = groups
                .iter()
                .map(|&(first, live, _)| {
                    ValueGroup::new(
                        std::array::from_fn(|r| if r < live { probs.next().unwrap() } else { &[] }),
                        std::array::from_fn(|r| self.visible(first + r).start),
                        live,
                    )
                })
                .collect();
            for block in key_blocks(all) {
                for (g, out) in value_groups.iter().zip(out.chunks_mut(QUERY_GROUP * d)) {
                    let keys = g.keys.start.max(block.start)..g.keys.end.min(block.end);
                    if !keys.is_empty() {
                        weighted_values(self.isa, g, keys, self.v, out);
                    }
                }
            }
        });
    }

    /// The keys query `i` sees.
    fn visible(&self, i: usize) -> std::ops::Range<usize> {
        (i + 1).saturating_sub(self.window)..i + 1
    }

    /// Scaled scores `(q_i·k_j)·scale` of queries `first..first + live` for keys `keys` into
    /// `scores[r·cols + j]`, and `maxima[r]` raised to the largest of them over query
    /// `first + r`'s visible keys (NaN ignored, as `f32::max` does; the maximum of the other
    /// values does not depend on the order they are compared in, a ±0 tie giving either zero,
    /// which the softmax subtracts to the same differences). Found as the scores are stored:
    /// a separate pass to scale them and find the maximum was a sixth of the attention time.
    fn scores(
        &self,
        first: usize,
        live: usize,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        maxima: &mut [f32],
    ) {
        assert!(maxima.len() >= live, "one maximum per query");
        #[cfg(target_arch = "x86_64")]
        {
            match self.isa.min(super::isa()) {
                // SAFETY: AVX-512F, AVX2 and FMA were detected and seen to execute; the ranges
                // are in bounds (keys ⊆ 0..cols, queries < t) and checked inside.
                super::Isa::Avx512 | super::Isa::Avx512Bf16 | super::Isa::Amx => {
                    return unsafe { avx512::scores(self, first, live, keys, scores, maxima) }
                }
                // SAFETY: as above, for AVX2 and FMA.
                super::Isa::Avx2 => {
                    return unsafe { avx2::scores(self, first, live, keys, scores, maxima) }
                }
                super::Isa::Portable => {}
            }
        }
        // The definition, one score at a time (the SIMD versions perform the same operations).
        for r in 0..live {
            let q = &self.q[(first + r) * self.d..][..self.d];
            let visible = self.visible(first + r);
            for j in keys.clone() {
                let mut s = 0f32;
                for (dd, &qd) in q.iter().enumerate() {
                    s = qd.mul_add(self.kt[kt_index(self.d, j, dd)], s);
                }
                let s = s * self.scale;
                scores[r * self.cols + j] = s;
                if visible.contains(&j) {
                    maxima[r] = maxima[r].max(s);
                }
            }
        }
    }
}

/// Which of the `lanes` (at most 16) keys from `j0` lie in `visible`: bit `l` for key `j0 + l`.
#[inline(always)]
fn visible_lanes(j0: usize, lanes: usize, visible: &std::ops::Range<usize>) -> u32 {
    let lo = visible.start.saturating_sub(j0).min(lanes);
    let hi = visible.end.saturating_sub(j0).min(lanes);
    if hi <= lo {
        0
    } else {
        ((1u32 << hi) - 1) & !((1u32 << lo) - 1)
    }
}

/// In place, per row of scaled scores: minus the row's maximum (`maxima`), exponentiated,
/// divided by their sum in key order. The rows' sums are independent chains and run
/// interleaved, eight at a time, so that their additions overlap (one sequential chain per
/// row was a tenth of the attention time; four at a time still waited on the adder's latency).
fn softmax_rows(isa: super::Isa, rows: &mut [&mut [f32]], maxima: &[f32]) {
    const CHAINS: usize = 8;
    for (row, &max) in rows.iter_mut().zip(maxima) {
        super::math::exp_shifted_in_place_with(isa, row, max);
    }
    for rows in rows.chunks_mut(CHAINS) {
        let sums: Vec<f32> = match rows.len() {
            CHAINS => row_sums::<CHAINS>(rows).to_vec(),
            n => rows
                .chunks(1.max(n / 2))
                .flat_map(|half| match half.len() {
                    4 => row_sums::<4>(half).to_vec(),
                    2 => row_sums::<2>(half).to_vec(),
                    _ => half
                        .iter()
                        .map(|row| row_sums::<1>(std::slice::from_ref(row))[0])
                        .collect(),
                })
                .collect(),
        };
        for (row, sum) in rows.iter_mut().zip(sums) {
            divide(isa, row, sum);
        }
    }
}

/// The sums of `N` rows, each in key order from zero, as `N` interleaved chains (a fixed `N`
/// keeps the chains in registers).
fn row_sums<const N: usize>(rows: &[&mut [f32]]) -> [f32; N] {
    let shortest = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let heads: [&[f32]; N] = std::array::from_fn(|r| &rows[r][..shortest]);
    let mut sums = [0f32; N];
    for j in 0..shortest {
        for (sum, head) in sums.iter_mut().zip(&heads) {
            *sum += head[j];
        }
    }
    for (sum, row) in sums.iter_mut().zip(rows) {
        for &e in &row[shortest..] {
            *sum += e;
        }
    }
    sums
}

/// `x / divisor` for every element: exact per element, so any vector width gives the same bits.
fn divide(isa: super::Isa, row: &mut [f32], divisor: f32) {
    #[cfg(target_arch = "x86_64")]
    if isa.min(super::isa()) >= super::Isa::Avx512 {
        // SAFETY: AVX-512F was detected and seen to execute.
        return unsafe { avx512::divide(row, divisor) };
    }
    let _ = isa;
    for s in row.iter_mut() {
        *s /= divisor;
    }
}

/// A query group's probabilities and the keys each query sees (`start[r]..end[r]`, within
/// `keys`); queries from `live` on are absent.
struct ValueGroup<'a> {
    probs: [&'a [f32]; QUERY_GROUP],
    start: [usize; QUERY_GROUP],
    end: [usize; QUERY_GROUP],
    keys: std::ops::Range<usize>,
    live: usize,
}

impl<'a> ValueGroup<'a> {
    fn new(probs: [&'a [f32]; QUERY_GROUP], start: [usize; QUERY_GROUP], live: usize) -> Self {
        let end = std::array::from_fn(|r| start[r] + probs[r].len());
        let keys = (0..live).map(|r| start[r]).min().unwrap_or(0)
            ..(0..live).map(|r| end[r]).max().unwrap_or(0);
        ValueGroup {
            probs,
            start,
            end,
            keys,
            live,
        }
    }
}

/// `out_r[dd] += Σ_{j ∈ keys} p_r[j − start_r]·v[j·d + dd]` for the group's queries (`out`
/// holds their rows of `d`, the chains so far): one fused multiply-add chain per element over
/// its query's keys in order, continued from `out` (zero before the first keys). The SIMD paths
/// run the queries together: their chains are independent, so they overlap, and each `v_j` is
/// loaded once for the group.
fn weighted_values(
    isa: super::Isa,
    g: &ValueGroup<'_>,
    keys: std::ops::Range<usize>,
    v: &[f32],
    out: &mut [f32],
) {
    let d = out.len() / g.live.max(1);
    assert!(
        out.len() == g.live * d
            && keys.start >= g.keys.start
            && keys.end <= g.keys.end
            && v.len() >= g.keys.end * d,
        "value group shapes"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let level = isa.min(super::isa());
        if level >= super::Isa::Avx512 && d.is_multiple_of(16) {
            // SAFETY: AVX-512F was detected and seen to execute; `v` holds the group's key
            // rows and `out` its rows of `d` (asserted above).
            return unsafe { avx512::weighted_values(g, keys, v, d, out) };
        }
        if level >= super::Isa::Avx2 && d.is_multiple_of(8) {
            // SAFETY: as above, for AVX2 and FMA.
            return unsafe { avx2::weighted_values(g, keys, v, d, out) };
        }
    }
    let _ = isa;
    for (r, o) in out.chunks_exact_mut(d).enumerate() {
        for j in g.start[r].max(keys.start)..g.end[r].min(keys.end) {
            let p = g.probs[r][j - g.start[r]];
            for (o, &x) in o.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                *o = p.mul_add(x, *o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
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

    /// Output columns `c0..c0 + 8·V` of the group's queries, their chains continued over
    /// `keys`.
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
        for j in keys {
            let row = v.as_ptr().add(j * d + c0);
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
        for (r, acc_r) in acc.iter().enumerate().take(g.live) {
            let o = out.as_mut_ptr().add(r * d + c0);
            for (c, a) in acc_r.iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * c), *a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::super::panel::tests::lcg;
    use super::*;

    /// Textbook attention in f64 with an explicit mask.
    fn naive(q: &[f32], k: &[f32], v: &[f32], s: AttentionShape, scale: f64, w: usize) -> Vec<f64> {
        let AttentionShape {
            batch,
            heads,
            kv_heads,
            t,
            head_dim: d,
        } = s;
        let mut y = vec![0f64; batch * t * heads * d];
        for b in 0..batch {
            for h in 0..heads {
                let kv = b * kv_heads + h / (heads / kv_heads);
                for i in 0..t {
                    let qi = &q[((b * heads + h) * t + i) * d..][..d];
                    let js: Vec<usize> = (0..=i).filter(|&j| i - j < w).collect();
                    let sc: Vec<f64> = js
                        .iter()
                        .map(|&j| {
                            let kj = &k[(kv * t + j) * d..][..d];
                            qi.iter()
                                .zip(kj)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for dd in 0..d {
                        y[((b * t + i) * heads + h) * d + dd] = js
                            .iter()
                            .zip(&e)
                            .map(|(&j, &p)| p / z * v[(kv * t + j) * d + dd] as f64)
                            .sum();
                    }
                }
            }
        }
        y
    }

    /// Every level stores the same scaled scores and finds the same maxima over each query's
    /// visible keys (a sliding window included) as the portable definition, whether a
    /// query's keys come in one call or in two: with NaN and infinite keys, an all-zero query
    /// (every score ±0, by the sign of the scale) and queries whose visible keys begin or end
    /// inside a vector.
    #[test]
    fn scores_and_maxima_are_the_same_at_every_level() {
        use super::super::panel::tests::available_isas;
        let mut seed = 7;
        // A head size that is no multiple of a vector (the kernels' vectors run over keys).
        let (t, d, cols) = (70, 12, 80);
        let mut q: Vec<f32> = (0..t * d).map(|_| lcg(&mut seed) * 4.0 - 2.0).collect();
        q[21 * d..22 * d].fill(0.0);
        let mut kt = vec![0f32; d * cols];
        for j in 0..t {
            for dd in 0..d {
                kt[kt_index(d, j, dd)] = match (j % 23, dd) {
                    (5, 3) => f32::NAN,
                    (9, 0) => f32::INFINITY,
                    _ => lcg(&mut seed) * 2.0 - 1.0,
                };
            }
        }
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for (scale, window) in [(0.3, usize::MAX), (-0.25, 5), (0.125, 17)] {
            for isa in available_isas() {
                let head = Head {
                    q: &q,
                    kt: &kt,
                    v: &[],
                    d,
                    cols,
                    scale,
                    window,
                    isa,
                };
                let portable = Head {
                    isa: super::super::Isa::Portable,
                    ..head
                };
                for (first, live) in [
                    (0usize, 4usize),
                    (17, 4),
                    (20, 3),
                    (37, 4),
                    (66, 4),
                    (69, 1),
                ] {
                    let lo = (first + 1).saturating_sub(window) / 16 * 16;
                    let hi = (first + live).div_ceil(16) * 16;
                    let mid = (lo + hi) / 32 * 16;
                    let mut want = (vec![0f32; QUERY_GROUP * cols], [f32::NEG_INFINITY; 4]);
                    portable.scores(first, live, lo..hi, &mut want.0, &mut want.1);
                    let mut got = (vec![0f32; QUERY_GROUP * cols], [f32::NEG_INFINITY; 4]);
                    head.scores(first, live, lo..mid, &mut got.0, &mut got.1);
                    head.scores(first, live, mid..hi, &mut got.0, &mut got.1);
                    for r in 0..live {
                        let visible = head.visible(first + r);
                        let max = want.0[r * cols..][visible]
                            .iter()
                            .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                        let at =
                            format!("{isa:?} scale {scale} window {window} query {}", first + r);
                        assert!(same(want.1[r], max), "portable maximum, {at}");
                        assert!(same(got.1[r], max), "maximum, {at}");
                        let row = |x: &[f32]| x[r * cols + lo..r * cols + hi].to_vec();
                        let equal = row(&got.0)
                            .iter()
                            .zip(&row(&want.0))
                            .all(|(&a, &b)| same(a, b));
                        assert!(equal, "scores, {at}");
                    }
                }
            }
        }
    }

    #[test]
    fn matches_naive_attention_on_odd_shapes() {
        let mut seed = 29;
        for (shape, window) in [
            (
                AttentionShape {
                    batch: 1,
                    heads: 1,
                    kv_heads: 1,
                    t: 1,
                    head_dim: 8,
                },
                None,
            ),
            (
                AttentionShape {
                    batch: 2,
                    heads: 3,
                    kv_heads: 1,
                    t: 37,
                    head_dim: 16,
                },
                None,
            ),
            (
                AttentionShape {
                    batch: 1,
                    heads: 4,
                    kv_heads: 2,
                    t: 70,
                    head_dim: 24,
                },
                Some(9),
            ),
            (
                AttentionShape {
                    batch: 1,
                    heads: 2,
                    kv_heads: 2,
                    t: 45,
                    head_dim: 12,
                },
                Some(1),
            ),
            (
                AttentionShape {
                    batch: 1,
                    heads: 2,
                    kv_heads: 1,
                    t: 130,
                    head_dim: 72,
                },
                None,
            ),
        ] {
            let q: Vec<f32> = (0..shape.q_len()).map(|_| lcg(&mut seed) * 2.0).collect();
            let k: Vec<f32> = (0..shape.kv_len()).map(|_| lcg(&mut seed) * 2.0).collect();
            let v: Vec<f32> = (0..k.len()).map(|_| lcg(&mut seed)).collect();
            let scale = 1.0 / (shape.head_dim as f32).sqrt();
            let got = causal_attention(&q, &k, &v, shape, scale, window);
            let want = naive(
                &q,
                &k,
                &v,
                shape,
                scale as f64,
                window.unwrap_or(usize::MAX),
            );
            for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                assert!((g as f64 - e).abs() < 2e-5, "{shape:?} [{i}] {g} vs {e}");
            }
        }
    }

    #[test]
    fn a_sequence_does_not_depend_on_its_batch_mates() {
        let mut seed = 31;
        let s = AttentionShape {
            batch: 3,
            heads: 3,
            kv_heads: 3,
            t: 40,
            head_dim: 16,
        };
        let n = s.heads * s.t * s.head_dim;
        let q: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
        let k: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
        let v: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
        let all = causal_attention(&q, &k, &v, s, 0.25, None);
        let one = AttentionShape { batch: 1, ..s };
        let second = causal_attention(&q[n..2 * n], &k[n..2 * n], &v[n..2 * n], one, 0.25, None);
        assert_eq!(&all[n..2 * n], second.as_slice());
    }

    /// Time of one Llama-3.2-1B layer's attention (32 heads, 8 KV heads, d 64, t 512 or
    /// `PPL_BENCH_T`) at the process's level, the fastest of `PPL_BENCH_REPS` runs (default 3);
    /// compare with `PPL_ISA=avx2`:
    /// `cargo test --release --lib attention::tests::throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn throughput() {
        let mut seed = 41;
        let t = std::env::var("PPL_BENCH_T")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(512);
        let s = AttentionShape {
            batch: 1,
            heads: 32,
            kv_heads: 8,
            t,
            head_dim: 64,
        };
        let q: Vec<f32> = (0..s.q_len()).map(|_| lcg(&mut seed)).collect();
        let k: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed)).collect();
        let v: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed)).collect();
        let reps = crate::test_util::bench_count("PPL_BENCH_REPS", 3);
        let best = (0..reps)
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(causal_attention(&q, &k, &v, s, 0.125, None));
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        // Two multiply-adds (score, weighted value) per head, visible key and head value.
        let flops = 4.0 * (s.heads * s.head_dim) as f64 * (t * (t + 1) / 2) as f64;
        println!(
            "attention {s:?}, {} kernels: {:.2} ms, {:.1} GFLOP/s",
            super::super::isa().name(),
            best * 1e3,
            flops / best / 1e9
        );
    }

    #[test]
    fn every_isa_level_gives_the_same_bits() {
        use super::super::panel::tests::available_isas;
        let mut seed = 37;
        // Weighted values of groups whose queries start and end at different keys, for head
        // sizes with and without a multiple of 8 or 16.
        let spans = [(0, 23), (2, 22), (5, 25), (6, 30)];
        for d in [12, 16, 24, 64, 72, 136] {
            let v: Vec<f32> = (0..30 * d).map(|_| lcg(&mut seed)).collect();
            let probs: Vec<Vec<f32>> = spans
                .iter()
                .map(|&(a, b)| (a..b).map(|_| lcg(&mut seed).abs()).collect())
                .collect();
            for live in 1..=QUERY_GROUP {
                let group = ValueGroup::new(
                    std::array::from_fn(|r| if r < live { &probs[r][..] } else { &[] }),
                    std::array::from_fn(|r| spans[r].0),
                    live,
                );
                let mut want = vec![0f32; live * d];
                for (r, o) in want.chunks_exact_mut(d).enumerate() {
                    for (j, &p) in (spans[r].0..spans[r].1).zip(&probs[r]) {
                        for dd in 0..d {
                            o[dd] = p.mul_add(v[j * d + dd], o[dd]);
                        }
                    }
                }
                for isa in available_isas() {
                    // Whole, and resumed at key 11 and at key 24: the same chains.
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    let mut got = vec![0f32; live * d];
                    weighted_values(isa, &group, group.keys.clone(), &v, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{isa:?} d {d}, {live} queries");
                    let mut parts = vec![0f32; live * d];
                    let (a, b) = (group.keys.start, group.keys.end);
                    for keys in [a..11.max(a), 11.max(a)..24.min(b), 24.min(b)..b] {
                        weighted_values(isa, &group, keys, &v, &mut parts);
                    }
                    assert_eq!(bits(&parts), bits(&want), "{isa:?} d {d}, resumed");
                }
            }
        }
        // Whole calls: head sizes with and without a multiple of 8 or 16, windows, GQA, rows
        // of every length in a query group, and rows past a query block.
        for (shape, window) in [
            ((2, 4, 2, 70, 64), None),
            ((1, 3, 1, 37, 72), Some(9)),
            ((1, 2, 2, 45, 12), Some(1)),
            ((1, 2, 1, 130, 24), None),
            ((1, 2, 1, 50, 32), Some(5)),
            ((1, 1, 1, 35, 48), Some(33)),
        ] {
            let (batch, heads, kv_heads, t, head_dim) = shape;
            let s = AttentionShape {
                batch,
                heads,
                kv_heads,
                t,
                head_dim,
            };
            let q: Vec<f32> = (0..s.q_len()).map(|_| lcg(&mut seed) * 3.0).collect();
            let k: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed) * 3.0).collect();
            let v: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed)).collect();
            let bits = |isa| -> Vec<u32> {
                causal_attention_with(isa, (&q, &k, &v), s, 0.3, window)
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            };
            let want = bits(super::super::Isa::Portable);
            for isa in available_isas() {
                assert!(bits(isa) == want, "{isa:?} {s:?}");
            }
        }
    }
}
