//! [`Record`]: what a scored window leaves behind, whatever the scoring produces. The
//! data-parallel protocol ([`crate::parallel::data_parallel`]) streams records to rank 0 as
//! JSON, and the ledger ([`super::ledger`]) appends them to disk; both need only what this
//! trait gives. `ppl eval` records a [`WindowResult`] (exact NLL sums), `ppl compare` a
//! per-token comparison ([`crate::compare::WindowPart`]).

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::accumulator::{from_fixed, to_fixed};
use super::ledger::MAX_TOKEN_NLL;
use super::WindowResult;

/// One window's outcome as it travels between ranks and into the ledger. The JSON form must
/// carry every value bit for bit (`serde_json` is built with `float_roundtrip`).
pub trait Record: Serialize + DeserializeOwned + Send + 'static {
    /// The window's index in the run's plan.
    fn index(&self) -> usize;
    /// Notes which rank scored it, and when (seconds since that rank started scoring).
    fn stamp(&mut self, rank: usize, finished_s: f64);
    /// Tokens scored in the window.
    fn scored_tokens(&self) -> u64;
    /// Tokens fed to the model for it.
    fn input_tokens(&self) -> u64;
    /// Whether two records of one window hold the same values (the stamps aside): a ledger
    /// holding two different records of a window mixes two evaluations.
    fn same_values(&self, other: &Self) -> bool;
    /// Why a record read back from a ledger could not have been written by a run whose plan
    /// scores `expected` tokens in this window (`None`: plausible).
    fn implausibility(&self, expected: usize) -> Option<String>;
    /// The record as the ledger keeps it (by default all of it).
    fn ledger_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("records serialize")
    }
}

impl Record for WindowResult {
    fn index(&self) -> usize {
        self.index
    }
    fn stamp(&mut self, rank: usize, finished_s: f64) {
        self.rank = rank;
        self.finished_s = finished_s;
    }
    fn scored_tokens(&self) -> u64 {
        self.acc.count
    }
    fn input_tokens(&self) -> u64 {
        self.input_tokens as u64
    }
    fn same_values(&self, other: &Self) -> bool {
        self.acc == other.acc
    }
    /// As many tokens as the window scores, non-negative sums (an NLL is never negative), no
    /// more than [`MAX_TOKEN_NLL`] per token, and a sum of squares consistent with the sum
    /// (Σx² ≥ (Σx)²/n).
    fn implausibility(&self, expected: usize) -> Option<String> {
        let a = &self.acc;
        if a.count == 0 || a.count as usize != expected {
            return Some(format!(
                "{} scored tokens where the window scores {expected}",
                a.count
            ));
        }
        if a.sum < 0 || a.sum_sq < 0 {
            return Some("a negative NLL sum".into());
        }
        let n = i128::from(a.count);
        if a.sum > n.saturating_mul(to_fixed(MAX_TOKEN_NLL)) {
            return Some(format!(
                "an NLL sum of {} over {} tokens (more than {MAX_TOKEN_NLL} nats a token)",
                from_fixed(a.sum),
                a.count
            ));
        }
        let (sum, sum_sq) = (from_fixed(a.sum), from_fixed(a.sum_sq));
        // Each token's square was rounded once to 2^-64: allow that much, relative and absolute.
        if sum * sum / a.count as f64 > sum_sq * (1.0 + 1e-9) + 1e-9 {
            return Some(format!(
                "a sum of squares {sum_sq} smaller than (sum {sum})² / {} tokens allows",
                a.count
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::NllAccumulator;

    #[test]
    fn a_window_result_survives_the_wire_bit_for_bit() {
        let mut acc = NllAccumulator::default();
        for x in [0.1, 2.0f64.sqrt(), 1e-300, 7.25] {
            acc.add(x);
        }
        let mut r = WindowResult {
            index: 7,
            group: 3,
            input_tokens: 512,
            acc,
            rank: 0,
            finished_s: 0.0,
        };
        r.stamp(2, 1.0 / 3.0);
        let back: WindowResult = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.finished_s.to_bits(), (1.0f64 / 3.0).to_bits());
        assert_eq!((back.index(), back.rank), (7, 2));
        assert_eq!((back.scored_tokens(), back.input_tokens()), (4, 512));
        let mut other = back.clone();
        other.stamp(5, 9.0);
        assert!(back.same_values(&other));
        other.acc.add(1.0);
        assert!(!back.same_values(&other));
    }
}
