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
    #[cfg(target_arch = "x86_64")]
    if isa.min(super::isa()) >= super::Isa::Avx2 {
        // SAFETY: AVX2 was detected and seen to execute.
        return unsafe { avx2::divide(row, divisor) };
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

    /// The keys of `keys` that every query of the group sees, where the group is full (else
    /// none): the SIMD paths add them without testing each query.
    fn shared_keys(&self, keys: &std::ops::Range<usize>) -> std::ops::Range<usize> {
        if self.live < QUERY_GROUP {
            return keys.start..keys.start;
        }
        let lo = self.start.iter().copied().max().unwrap_or(0);
        let lo = lo.clamp(keys.start, keys.end.max(keys.start));
        let hi = self.end.iter().copied().min().unwrap_or(0).min(keys.end);
        lo..hi.max(lo)
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
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests;
