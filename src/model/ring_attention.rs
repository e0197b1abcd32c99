//! Attention over a window whose positions are split across context-parallel ranks (ring
//! attention): the arithmetic, free of any communication.
//!
//! Each window of `T` positions is cut into `2·cp` equal chunks; rank `i` holds chunk `i` and
//! chunk `2·cp − 1 − i` ([`ChunkLayout`]), so every rank has as many early positions (few keys
//! to attend to) as late ones (many): causal attention costs the same on every rank.
//!
//! A rank's queries meet the keys and values of one rank's block at a time. For each block,
//! [`block_partial`] computes, per query, the softmax pieces over that block's visible keys:
//! the largest score `m`, the sum `l` of `e^(s − m)` and the unnormalised output
//! `o = Σ e^(s − m)·v`. [`merge_partials`] combines the blocks' pieces **in the order given**
//! (the caller passes them in cp-rank order 0..cp, whatever order they arrived in), rescaling
//! by `e^(m_old − m_new)`, and divides by the sum. The float order is therefore fixed: a
//! result never depends on message timing, threads or how windows are batched.
//!
//! [`ContextParallel`] is the hook the forward pass calls: it knows this rank's positions (for
//! RoPE at absolute positions) and runs the ring (see `crate::parallel::context_parallel`).

use rayon::prelude::*;

use super::kernels::attention::AttentionShape;
use super::kernels::math;
use super::ModelError;

/// How a window of `len` positions is shared by `cp` ranks: chunk `rank` and its mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLayout {
    pub cp: usize,
    pub len: usize,
}

impl ChunkLayout {
    /// The layout, when `len` cuts into `2·cp` equal non-empty chunks.
    pub fn new(cp: usize, len: usize) -> Option<Self> {
        (cp >= 1 && len >= 2 * cp && len.is_multiple_of(2 * cp)).then_some(Self { cp, len })
    }

    pub fn chunk(&self) -> usize {
        self.len / (2 * self.cp)
    }

    /// Positions held by each rank.
    pub fn local_len(&self) -> usize {
        2 * self.chunk()
    }

    /// The absolute positions of `rank`'s rows, ascending: chunk `rank`, then chunk
    /// `2·cp − 1 − rank`.
    pub fn positions(&self, rank: usize) -> Vec<usize> {
        let c = self.chunk();
        let back = 2 * self.cp - 1 - rank;
        (rank * c..(rank + 1) * c)
            .chain(back * c..(back + 1) * c)
            .collect()
    }
}

/// One block's softmax pieces for every query: `m`, `l` per (sequence, head, query) and `o`
/// (`head_dim` values each). A query that sees no key of the block has `l = 0`, `m = −∞`.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    pub o: Vec<f32>,
}

/// Positions of queries and of a block's keys (each ascending).
#[derive(Debug, Clone, Copy)]
pub struct BlockPositions<'a> {
    pub queries: &'a [usize],
    pub keys: &'a [usize],
}

/// `q [batch, heads, tq, d]` against one block `k`/`v [batch, kv_heads, tk, d]`: each query at
/// position `p` sees the keys at `p − window < j ≤ p`. `shape.t` is ignored (the lengths come
/// from `pos`).
pub fn block_partial(
    (q, k, v): (&[f32], &[f32], &[f32]),
    shape: AttentionShape,
    pos: BlockPositions<'_>,
    scale: f32,
    window: Option<usize>,
) -> Partial {
    let (tq, tk, d) = (pos.queries.len(), pos.keys.len(), shape.head_dim);
    let rows = shape.batch * shape.heads * tq;
    let group = shape.heads / shape.kv_heads.max(1);
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut o = vec![0f32; rows * d];
    o.par_chunks_mut(d)
        .zip(m.par_iter_mut().zip(l.par_iter_mut()))
        .enumerate()
        .with_min_len(16)
        .for_each_init(Vec::new, |scores, (row, (out, (m, l)))| {
            let (bh, qi) = (row / tq, row % tq);
            let (b, h) = (bh / shape.heads, bh % shape.heads);
            let kv = (b * shape.kv_heads + h / group) * tk * d;
            let p = pos.queries[qi];
            // The visible keys are a contiguous run: positions are ascending.
            let end = pos.keys.partition_point(|&j| j <= p);
            let start = match window {
                Some(w) => pos.keys.partition_point(|&j| j + w <= p),
                None => 0,
            };
            if start >= end {
                return;
            }
            let qrow = &q[row * d..(row + 1) * d];
            scores.clear();
            scores
                .extend((start..end).map(|j| dot(qrow, &k[kv + j * d..kv + (j + 1) * d]) * scale));
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            scores.iter_mut().for_each(|s| *s -= max);
            math::exp_in_place(scores);
            let mut sum = 0f32;
            for (j, &e) in (start..end).zip(scores.iter()) {
                sum += e;
                let vrow = &v[kv + j * d..kv + (j + 1) * d];
                out.iter_mut().zip(vrow).for_each(|(o, &x)| *o += e * x);
            }
            *m = max;
            *l = sum;
        });
    Partial { m, l, o }
}

/// A dot product in a fixed order: eight interleaved chains over the elements, then the
/// chains summed in order (vectorisable, and the same bits on every run). Plain multiply and
/// add, not `mul_add`: without FMA enabled at compile time that is a slow library call.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Merges the blocks' pieces in the order given and normalises: `[batch, heads, tq, d]`
/// pieces → `[batch, tq, heads·d]` outputs (the layout of the attention output projection's
/// input). A query that saw no key at all (impossible under a causal mask: a position sees
/// itself) gives zeros.
pub fn merge_partials(parts: &[Partial], shape: AttentionShape, tq: usize) -> Vec<f32> {
    let (d, heads) = (shape.head_dim, shape.heads);
    let mut out = vec![0f32; shape.batch * heads * tq * d];
    // Output row (b, qi) holds every head's values for that query.
    out.par_chunks_mut(heads * d)
        .enumerate()
        .for_each(|(bq, row_out)| {
            let (b, qi) = (bq / tq, bq % tq);
            for h in 0..heads {
                let row = (b * heads + h) * tq + qi;
                let mut m = f32::NEG_INFINITY;
                let mut l = 0f32;
                let acc = &mut row_out[h * d..(h + 1) * d];
                for p in parts {
                    if p.l[row] == 0.0 {
                        continue;
                    }
                    let m_new = m.max(p.m[row]);
                    let old = math::exp(m - m_new);
                    let new = math::exp(p.m[row] - m_new);
                    l = l * old + p.l[row] * new;
                    let po = &p.o[row * d..(row + 1) * d];
                    acc.iter_mut()
                        .zip(po)
                        .for_each(|(a, &x)| *a = *a * old + x * new);
                    m = m_new;
                }
                if l > 0.0 {
                    acc.iter_mut().for_each(|a| *a /= l);
                }
            }
        });
    out
}

/// The forward pass's hook for a window split across context-parallel ranks.
pub trait ContextParallel: Sync {
    /// Absolute positions of this rank's rows in each window (for RoPE).
    fn positions(&self) -> &[usize];

    /// Attention of this rank's queries against the whole window: `q [batch, heads, t, d]`,
    /// `k`/`v [batch, kv_heads, t, d]` of this rank's `t` positions → `[batch, t, heads·d]`.
    fn attend(
        &self,
        qkv: (&[f32], &[f32], &[f32]),
        shape: AttentionShape,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Vec<f32>, ModelError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, heads: usize, kv_heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape {
            batch,
            heads,
            kv_heads,
            t: 0,
            head_dim,
        }
    }

    #[test]
    fn chunks_are_load_balanced_mirrors_covering_the_window() {
        let l = ChunkLayout::new(2, 8).unwrap();
        assert_eq!(l.positions(0), vec![0, 1, 6, 7]);
        assert_eq!(l.positions(1), vec![2, 3, 4, 5]);
        let l = ChunkLayout::new(3, 12).unwrap();
        assert_eq!(l.positions(0), vec![0, 1, 10, 11]);
        assert_eq!(l.positions(1), vec![2, 3, 8, 9]);
        assert_eq!(l.positions(2), vec![4, 5, 6, 7]);
        for cp in 1..=5 {
            let l = ChunkLayout::new(cp, 2 * cp * 7).unwrap();
            let mut all: Vec<usize> = (0..cp).flat_map(|r| l.positions(r)).collect();
            all.sort_unstable();
            assert_eq!(all, (0..l.len).collect::<Vec<_>>());
            // Causal work (keys seen) is the same on every rank.
            let work: Vec<usize> = (0..cp)
                .map(|r| l.positions(r).iter().map(|p| p + 1).sum())
                .collect();
            assert!(work.iter().all(|&w| w == work[0]), "cp {cp}: {work:?}");
        }
        assert_eq!(ChunkLayout::new(2, 6), None);
        assert_eq!(ChunkLayout::new(3, 3), None);
        assert_eq!(ChunkLayout::new(2, 4).map(|l| l.chunk()), Some(1));
    }

    /// Deterministic pseudo-random values in [-2, 2).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Textbook attention in f64 over whole `[batch, heads, len, d]` tensors.
    fn naive(
        (q, k, v): (&[f32], &[f32], &[f32]),
        s: AttentionShape,
        len: usize,
        scale: f64,
        window: Option<usize>,
    ) -> Vec<f64> {
        let d = s.head_dim;
        let mut out = vec![0f64; s.batch * len * s.heads * d];
        for b in 0..s.batch {
            for h in 0..s.heads {
                let kvh = h / (s.heads / s.kv_heads);
                for i in 0..len {
                    let qr = &q[((b * s.heads + h) * len + i) * d..][..d];
                    let keys: Vec<usize> = (0..=i)
                        .filter(|&j| window.is_none_or(|w| i - j < w))
                        .collect();
                    let sc: Vec<f64> = keys
                        .iter()
                        .map(|&j| {
                            let kr = &k[((b * s.kv_heads + kvh) * len + j) * d..][..d];
                            qr.iter()
                                .zip(kr)
                                .map(|(&a, &c)| a as f64 * c as f64)
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (&j, &w) in keys.iter().zip(&e) {
                        let vr = &v[((b * s.kv_heads + kvh) * len + j) * d..][..d];
                        for dd in 0..d {
                            out[((b * len + i) * s.heads + h) * d + dd] += w / z * vr[dd] as f64;
                        }
                    }
                }
            }
        }
        out
    }

    /// Rows `positions` of a `[batch, heads, len, d]` tensor.
    fn take(x: &[f32], batch_heads: usize, len: usize, d: usize, positions: &[usize]) -> Vec<f32> {
        let mut out = Vec::new();
        for bh in 0..batch_heads {
            for &p in positions {
                out.extend_from_slice(&x[(bh * len + p) * d..][..d]);
            }
        }
        out
    }

    #[test]
    fn ring_blocks_merged_in_rank_order_match_naive_attention() {
        for (cp, window) in [(1, None), (2, None), (3, None), (4, Some(5)), (3, Some(9))] {
            let s = shape(2, 4, 2, 16);
            let len = 2 * cp * 6;
            let layout = ChunkLayout::new(cp, len).unwrap();
            let q = values(s.batch * s.heads * len * s.head_dim, 1);
            let k = values(s.batch * s.kv_heads * len * s.head_dim, 2);
            let v = values(s.batch * s.kv_heads * len * s.head_dim, 3);
            let scale = 0.25;
            let want = naive((&q, &k, &v), s, len, scale as f64, window);
            let d = s.head_dim;
            for rank in 0..cp {
                let qp = layout.positions(rank);
                let lq = take(&q, s.batch * s.heads, len, d, &qp);
                let parts: Vec<Partial> = (0..cp)
                    .map(|r| {
                        let kp = layout.positions(r);
                        let lk = take(&k, s.batch * s.kv_heads, len, d, &kp);
                        let lv = take(&v, s.batch * s.kv_heads, len, d, &kp);
                        let pos = BlockPositions {
                            queries: &qp,
                            keys: &kp,
                        };
                        block_partial((&lq, &lk, &lv), s, pos, scale, window)
                    })
                    .collect();
                let got = merge_partials(&parts, s, qp.len());
                for b in 0..s.batch {
                    for (qi, &p) in qp.iter().enumerate() {
                        let hd = s.heads * d;
                        let g = &got[(b * qp.len() + qi) * hd..][..hd];
                        let w = &want[(b * len + p) * hd..][..hd];
                        for (x, y) in g.iter().zip(w) {
                            assert!(
                                (*x as f64 - y).abs() < 2e-5,
                                "cp {cp} window {window:?} rank {rank} pos {p}: {x} vs {y}"
                            );
                        }
                    }
                }
                // A fixed merge order gives the same bits every time.
                assert_eq!(got, merge_partials(&parts, s, qp.len()));
            }
        }
    }

    #[test]
    fn a_block_wholly_in_the_future_contributes_nothing() {
        let s = shape(1, 1, 1, 8);
        let q = values(8 * 2, 4);
        let k = values(8 * 2, 5);
        let pos = BlockPositions {
            queries: &[0, 1],
            keys: &[2, 3],
        };
        let p = block_partial((&q, &k, &k), s, pos, 1.0, None);
        assert_eq!(p.l, vec![0.0, 0.0]);
        assert!(p.m.iter().all(|m| *m == f32::NEG_INFINITY));
        assert!(p.o.iter().all(|o| *o == 0.0));
    }
}
