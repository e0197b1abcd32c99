//! Context parallelism (`--cp N`): each window's positions split across the `cp` ranks of a
//! group, attention by a ring, exact accounting.
//!
//! Rank `i` of a cp group holds chunks `i` and `2·cp − 1 − i` of every window
//! ([`ChunkLayout`]), runs every layer of its model part on those positions (RoPE at their
//! absolute positions) and meets the rest of the window in attention only: its keys and
//! values pass around the group ([`Ring`]: `cp − 1` steps of send-to-next,
//! receive-from-previous; a block is sent on before it is used, so the transfer overlaps the
//! block's attention). The blocks' partial softmax results are merged in cp-rank order
//! ([`crate::model::ring_attention`]), never in arrival order, so results do not depend on
//! timing.
//!
//! Scoring: every rank computes the NLL of its own scored positions (every rank knows the
//! window's tokens, hence the targets) into exact per-window records, which the replica's
//! leader adds up ([`merge_records`]: fixed-point sums, so the total is the same whatever
//! the split).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use candle_core::Tensor;

use crate::comm::codec::{self, CommDtype};
use crate::comm::group::Group;
use crate::comm::{CommError, Communicator};
use crate::data::Window;
use crate::eval::WindowResult;
use crate::model::kernels::attention::AttentionShape;
use crate::model::ring_attention::{
    block_partial, merge_partials, BlockPositions, ChunkLayout, ContextParallel, Partial,
};
use crate::model::ModelError;

/// Tag of the key/value blocks inside the cp group.
const RING: u32 = 1;

/// The rules `--cp` puts on a window of `len` positions, checked before loading: the window
/// must cut into `2·cp` equal chunks.
pub fn check_window(cp: usize, len: usize, flag: &str) -> Result<(), String> {
    if cp <= 1 {
        return Ok(());
    }
    if len < 2 * cp {
        return Err(format!(
            "--cp {cp} needs windows of at least 2·cp = {} tokens ({flag} is {len}): every rank takes two chunks of each window; lower --cp or raise {flag}",
            2 * cp
        ));
    }
    if !len.is_multiple_of(2 * cp) {
        let down = len / (2 * cp) * (2 * cp);
        return Err(format!(
            "--cp {cp} cuts each window into 2·cp = {} equal chunks, but {flag} {len} is not divisible by {}; use {flag} {down} or {}, or another --cp",
            2 * cp,
            2 * cp,
            down + 2 * cp
        ));
    }
    Ok(())
}

/// Traffic of the ring on one rank, over the run.
#[derive(Debug, Default)]
pub struct RingMeter {
    pub bytes_sent: AtomicU64,
    pub nanos: AtomicU64,
}

impl RingMeter {
    pub fn bytes(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }

    pub fn seconds(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

/// One step's ring: this rank's place in its cp group and the layout of the step's windows.
pub struct Ring<'a> {
    group: &'a Group<'a>,
    layout: ChunkLayout,
    positions: Vec<usize>,
    comm_dtype: CommDtype,
    meter: &'a RingMeter,
}

impl<'a> Ring<'a> {
    pub fn new(
        group: &'a Group<'a>,
        layout: ChunkLayout,
        comm_dtype: CommDtype,
        meter: &'a RingMeter,
    ) -> Self {
        Self {
            positions: layout.positions(group.rank()),
            group,
            layout,
            comm_dtype,
            meter,
        }
    }

    fn timed<T>(&self, f: impl FnOnce() -> Result<T, CommError>) -> Result<T, ModelError> {
        let t0 = Instant::now();
        let out = f();
        self.meter
            .nanos
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out.map_err(ModelError::Comm)
    }

    /// A block's keys then values, as `--comm-dtype`.
    fn encode(&self, k: &[f32], v: &[f32], row: usize) -> Vec<u8> {
        let mut b = codec::encode(k, row, self.comm_dtype);
        b.extend(codec::encode(v, row, self.comm_dtype));
        b
    }

    fn decode(
        &self,
        b: &[u8],
        row: usize,
        len: usize,
        from: usize,
    ) -> Result<Vec<f32>, ModelError> {
        codec::decode(b, row, self.comm_dtype)
            .filter(|x| x.len() == len)
            .ok_or_else(|| {
                ModelError::Comm(CommError::Protocol {
                    from,
                    detail: format!("a key/value block of {} bytes for {len} values", b.len()),
                })
            })
    }
}

impl ContextParallel for Ring<'_> {
    fn positions(&self) -> &[usize] {
        &self.positions
    }

    fn attend(
        &self,
        (q, k, v): (&[f32], &[f32], &[f32]),
        shape: AttentionShape,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Vec<f32>, ModelError> {
        let (n, me) = (self.group.size(), self.group.rank());
        let (d, kv_len) = (shape.head_dim, k.len());
        if q.len() != shape.batch * shape.heads * self.positions.len() * d || v.len() != kv_len {
            return Err(ModelError::Run(format!(
                "ring attention: {} query values and {}/{} key/value values for {} positions",
                q.len(),
                kv_len,
                v.len(),
                self.positions.len()
            )));
        }
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        // Every rank's block goes through the wire encoding, its own too, so a key has the
        // same value for every query whichever rank holds it.
        let mut block = self.encode(k, v, d);
        let mut parts: Vec<Option<Partial>> = vec![None; n];
        for step in 0..n {
            let origin = (me + n - step) % n;
            if step + 1 < n {
                let bytes = block.clone();
                self.meter
                    .bytes_sent
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                self.timed(|| self.group.send(next, RING, bytes))?;
            }
            let half = block.len() / 2;
            let kb = self.decode(&block[..half], d, kv_len, origin)?;
            let vb = self.decode(&block[half..], d, kv_len, origin)?;
            let keys = self.layout.positions(origin);
            let pos = BlockPositions {
                queries: &self.positions,
                keys: &keys,
            };
            parts[origin] = Some(block_partial((q, &kb, &vb), shape, pos, scale, window));
            if step + 1 < n {
                block = self.timed(|| self.group.recv(prev, RING))?;
            }
        }
        // Merged in cp-rank order, whatever the order of arrival.
        let parts: Vec<Partial> = parts.into_iter().flatten().collect();
        Ok(merge_partials(&parts, shape, self.positions.len()))
    }
}

/// Token ids of `rank`'s positions of each window, `[batch, local_len]`.
pub fn local_ids(
    batch: &[Window],
    layout: ChunkLayout,
    rank: usize,
    device: &candle_core::Device,
) -> Result<Tensor, ModelError> {
    let pos = layout.positions(rank);
    let mut ids = Vec::with_capacity(batch.len() * pos.len());
    for w in batch {
        check_len(w, layout)?;
        ids.extend(pos.iter().map(|&p| w.input[p]));
    }
    Ok(Tensor::from_vec(ids, (batch.len(), pos.len()), device)?)
}

fn check_len(w: &Window, layout: ChunkLayout) -> Result<(), ModelError> {
    if w.input.len() != layout.len {
        return Err(ModelError::Run(format!(
            "window {} has {} tokens, but context parallelism cut this batch for {}",
            w.index,
            w.input.len(),
            layout.len
        )));
    }
    Ok(())
}

/// The hidden states of `rank`'s scored positions and their targets, window after window,
/// and per window the window itself with only those targets (for its partial record). A rank
/// without scored positions gets no rows (it still joins the TP gather, with nothing).
pub fn local_scored_rows(
    hidden: &Tensor,
    batch: &[Window],
    layout: ChunkLayout,
    rank: usize,
) -> Result<(Tensor, Vec<u32>, Vec<Window>), ModelError> {
    let pos = layout.positions(rank);
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    let mut parts = Vec::with_capacity(batch.len());
    for (b, w) in batch.iter().enumerate() {
        check_len(w, layout)?;
        let scored = w.first_scored..w.first_scored + w.targets.len();
        let (local, mine): (Vec<u32>, Vec<u32>) = pos
            .iter()
            .enumerate()
            .filter(|(_, p)| scored.contains(p))
            .map(|(i, &p)| (i as u32, w.targets[p - w.first_scored]))
            .unzip();
        if !local.is_empty() {
            let idx = Tensor::from_vec(local, mine.len(), hidden.device())?;
            rows.push(hidden.get(b)?.index_select(&idx, 0)?);
        }
        targets.extend_from_slice(&mine);
        parts.push(Window {
            targets: mine,
            ..w.clone()
        });
    }
    let rows = if rows.is_empty() {
        hidden.get(0)?.narrow(0, 0, 0)?
    } else {
        Tensor::cat(&rows, 0)?
    };
    Ok((rows, targets, parts))
}

/// Adds up the partial records of the same windows from every cp rank (in cp order; the
/// sums are exact, so the order does not change them).
pub fn merge_records(
    parts: Vec<(usize, Vec<WindowResult>)>,
) -> Result<Vec<WindowResult>, CommError> {
    let mut it = parts.into_iter();
    let Some((_, mut total)) = it.next() else {
        return Ok(Vec::new());
    };
    for (from, part) in it {
        if part.len() != total.len() || part.iter().zip(&total).any(|(a, b)| a.index != b.index) {
            return Err(CommError::Protocol {
                from,
                detail: "context-parallel records for other windows than the leader's".into(),
            });
        }
        for (t, p) in total.iter_mut().zip(&part) {
            t.acc.merge(&p.acc);
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::NllAccumulator;

    #[test]
    fn window_rules_name_the_rule_and_the_fix() {
        assert!(check_window(1, 7, "--ctx").is_ok());
        assert!(check_window(2, 256, "--ctx").is_ok());
        let e = check_window(3, 2048, "--ctx").unwrap_err();
        assert!(e.contains("not divisible by 6"), "{e}");
        assert!(e.contains("--ctx 2046 or 2052"), "{e}");
        let e = check_window(4, 6, "--ctx").unwrap_err();
        assert!(e.contains("at least 2·cp = 8"), "{e}");
    }

    #[test]
    fn scored_rows_are_split_without_overlap_and_records_add_up() {
        let layout = ChunkLayout::new(2, 8).unwrap();
        let w = Window {
            index: 3,
            group: 3,
            start: 0,
            input: (10..18).collect(),
            first_scored: 4,
            targets: vec![11, 12, 13],
        };
        let hidden = Tensor::arange(0f32, 16.0, &candle_core::Device::Cpu)
            .unwrap()
            .reshape((1, 4, 4))
            .unwrap();
        // Rank 0 holds 0, 1, 6, 7: scores position 6; rank 1 holds 2..6: scores 4 and 5.
        let (rows, t0, p0) =
            local_scored_rows(&hidden, std::slice::from_ref(&w), layout, 0).unwrap();
        assert_eq!(t0, vec![13]);
        assert_eq!(
            rows.to_vec2::<f32>().unwrap(),
            vec![vec![8f32, 9., 10., 11.]]
        );
        let (_, t1, p1) = local_scored_rows(&hidden, std::slice::from_ref(&w), layout, 1).unwrap();
        assert_eq!(t1, vec![11, 12]);
        assert_eq!(p0[0].targets.len() + p1[0].targets.len(), w.targets.len());
        let rec = |xs: &[f64]| {
            let mut acc = NllAccumulator::default();
            xs.iter().for_each(|&x| acc.add(x));
            WindowResult {
                index: 3,
                group: 3,
                input_tokens: 8,
                acc,
                rank: 0,
                finished_s: 0.0,
            }
        };
        let merged =
            merge_records(vec![(0, vec![rec(&[0.5])]), (1, vec![rec(&[1.25, 2.0])])]).unwrap();
        assert_eq!(merged[0].acc, rec(&[0.5, 1.25, 2.0]).acc);
        let other = WindowResult {
            index: 4,
            ..rec(&[1.0])
        };
        assert!(merge_records(vec![(0, vec![rec(&[0.5])]), (1, vec![other])]).is_err());
    }
}
