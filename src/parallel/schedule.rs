//! Work distribution. The unit of work is a window; a *unit* handed out is up to
//! `batch_size` consecutive windows of equal length (one forward pass).
//!
//! - `static`: window `i` belongs to rank `i mod world`; each rank batches its own windows.
//! - `dynamic`: rank 0 hands out units on request, so a slow rank simply asks less often.
//!   Workers keep two requests in flight so rank 0's answer latency (it answers between its
//!   own batches) is hidden behind their current unit.
//!
//! Either way a window's result depends only on the window, so the final numbers never depend
//! on which rank scored what.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::data::Window;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Round-robin windows, decided up front.
    Static,
    /// Rank 0 hands out windows on request.
    Dynamic,
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Schedule::Static => "static",
            Schedule::Dynamic => "dynamic",
        })
    }
}

/// Groups window indices into units: runs of up to `batch` indices, consecutive in `indices`,
/// whose windows have the same input length.
pub fn units(windows: &[Window], indices: &[usize], batch: usize) -> VecDeque<Vec<usize>> {
    let mut out = VecDeque::new();
    let mut cur: Vec<usize> = Vec::new();
    for &i in indices {
        let same_len = cur
            .first()
            .is_none_or(|&f| windows[f].input.len() == windows[i].input.len());
        if !cur.is_empty() && (cur.len() >= batch.max(1) || !same_len) {
            out.push_back(std::mem::take(&mut cur));
        }
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push_back(cur);
    }
    out
}

/// The windows rank `rank` of `size` scores under the static schedule: every `size`-th of
/// the windows still to do, starting at the `rank`-th.
pub fn static_share(todo: &[usize], rank: usize, size: usize) -> Vec<usize> {
    todo.iter()
        .skip(rank)
        .step_by(size.max(1))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(index: usize, len: usize) -> Window {
        Window {
            index,
            group: index,
            start: 0,
            input: vec![0; len],
            first_scored: 0,
            targets: vec![0],
        }
    }

    #[test]
    fn static_shares_partition_the_windows() {
        for size in 1..=5 {
            let mut seen: Vec<usize> = (0..size)
                .flat_map(|r| static_share(&(0..17).collect::<Vec<_>>(), r, size))
                .collect();
            seen.sort();
            assert_eq!(seen, (0..17).collect::<Vec<_>>());
        }
        assert_eq!(static_share(&[0, 1, 2, 3, 4, 5, 6], 1, 3), vec![1, 4]);
        // Resuming: only the windows left, shared out the same way.
        assert_eq!(static_share(&[2, 3, 5, 8], 1, 2), vec![3, 8]);
    }

    #[test]
    fn units_respect_batch_size_and_equal_lengths() {
        let ws: Vec<Window> = [4, 4, 4, 4, 4, 2, 4]
            .iter()
            .enumerate()
            .map(|(i, &l)| w(i, l))
            .collect();
        let idx: Vec<usize> = (0..7).collect();
        let u: Vec<Vec<usize>> = units(&ws, &idx, 2).into_iter().collect();
        assert_eq!(u, vec![vec![0, 1], vec![2, 3], vec![4], vec![5], vec![6]]);
        let u: Vec<Vec<usize>> = units(&ws, &[0, 2, 4, 6], 8).into_iter().collect();
        assert_eq!(u, vec![vec![0, 2, 4, 6]]);
    }
}
