//! Start-up agreement: before any weight is loaded, every rank fingerprints what it is about
//! to evaluate (model file, data, tokenizer, scoring configuration); rank 0 compares them all
//! and broadcasts a verdict, so that on disagreement *every* rank stops with the same message
//! naming the rank, its host and what differs.

use serde::{Deserialize, Serialize};

use super::{CommError, Communicator};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprints {
    pub rank: usize,
    pub host: String,
    pub model_path: String,
    pub model_sha256: String,
    pub data_path: String,
    pub data_sha256: String,
    pub tokenizer_sha256: String,
    /// SHA-256 of the scoring-relevant configuration (JSON).
    pub config_sha256: String,
    pub config: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AgreementError {
    #[error("ranks disagree on their inputs, nothing was evaluated:\n{0}\nmake every rank see the same model, data and options (same files on every node), then re-run")]
    Disagree(String),
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// What differs between `a` (rank 0) and `b`, one line per item.
pub fn differences(a: &Fingerprints, b: &Fingerprints) -> Vec<String> {
    let short = |s: &str| s.chars().take(12).collect::<String>();
    let mut out = Vec::new();
    let who = format!("rank {} ({})", b.rank, b.host);
    let mut file = |what: &str, (pb, hb): (&str, &str), (pa, ha): (&str, &str)| {
        if hb != ha {
            out.push(format!(
                "{who}: different {what} file: {pb} (sha256 {}…) vs rank 0's {pa} (sha256 {}…)",
                short(hb),
                short(ha)
            ));
        }
    };
    file(
        "model",
        (&b.model_path, &b.model_sha256),
        (&a.model_path, &a.model_sha256),
    );
    file(
        "data",
        (&b.data_path, &b.data_sha256),
        (&a.data_path, &a.data_sha256),
    );
    if a.tokenizer_sha256 != b.tokenizer_sha256 {
        out.push(format!(
            "{who}: different tokenizer (sha256 {}… vs rank 0's {}…)",
            short(&b.tokenizer_sha256),
            short(&a.tokenizer_sha256)
        ));
    }
    if a.config_sha256 != b.config_sha256 {
        out.push(format!(
            "{who}: different options: {} vs rank 0's {}",
            b.config, a.config
        ));
    }
    out
}

/// The collective check; every rank gets the same `Ok` or the same error.
pub fn check(comm: &dyn Communicator, mine: &Fingerprints) -> Result<(), AgreementError> {
    let bytes = super::json::encode(mine);
    let verdict: Result<(), String> = match comm.gather(0, bytes)? {
        Some(all) => {
            let mut lines = Vec::new();
            let root = mine;
            for (r, b) in all.iter().enumerate().skip(1) {
                match serde_json::from_slice::<Fingerprints>(b) {
                    Ok(f) => lines.extend(differences(root, &f)),
                    Err(e) => lines.push(format!("rank {r}: unreadable fingerprints ({e}); are all ranks running the same ppl version?")),
                }
            }
            if lines.is_empty() {
                Ok(())
            } else {
                Err(lines.join("\n"))
            }
        }
        None => Ok(()),
    };
    let verdict = super::json::broadcast(comm, 0, Some(&verdict).filter(|_| comm.rank() == 0))?;
    verdict.map_err(AgreementError::Disagree)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(rank: usize, data: &str) -> Fingerprints {
        Fingerprints {
            rank,
            host: format!("node{rank}"),
            model_path: "m.gguf".into(),
            model_sha256: "aaaa".into(),
            data_path: format!("{data}.txt"),
            data_sha256: data.into(),
            tokenizer_sha256: "tttt".into(),
            config_sha256: "cccc".into(),
            config: "{}".into(),
        }
    }

    #[test]
    fn every_rank_learns_which_rank_differs() {
        let comms = crate::comm::local::world(3);
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let data = if c.rank() == 2 { "other" } else { "wiki" };
                    check(&c, &fp(c.rank(), data)).map_err(|e| e.to_string())
                })
            })
            .collect();
        for h in handles {
            let msg = h.join().unwrap().unwrap_err();
            assert!(
                msg.contains("rank 2 (node2): different data file: other.txt"),
                "{msg}"
            );
            assert!(!msg.contains("rank 1"), "{msg}");
        }
        assert!(differences(&fp(0, "a"), &fp(1, "a")).is_empty());
    }
}
