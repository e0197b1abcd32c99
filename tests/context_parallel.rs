//! Context parallelism (`--cp N`): each window split across ranks, attention by a ring.
//! Agrees with one rank within 1e-5 at f32 on the local and MPI backends, composes with
//! data parallelism (replicated and FSDP) and pipeline stages to the bit and with tensor
//! parallelism within 1e-5, does not depend on the batch size, meters the ring's bytes exactly,
//! and refuses windows that do not cut into 2·cp chunks.

mod common;

use common::{eval, ppl_cmd};
use ppl::report::Results;

fn relative(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

/// `--ctx ctx --chunks n --precision f32` plus `extra`.
fn workload(ctx: &'static str, chunks: &'static str, extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["--ctx", ctx, "--chunks", chunks, "--precision", "f32"];
    v.extend_from_slice(extra);
    v
}

/// Bytes one rank sends around the ring per window: every layer, `cp − 1` steps of its
/// block (keys and values of SmolLM2's 3 KV heads × 64 values at `ctx / cp` positions).
fn ring_bytes_per_window(ctx: u64, cp: u64, bytes_per_value: u64) -> u64 {
    30 * (cp - 1) * 2 * 3 * 64 * (ctx / cp) * bytes_per_value
}

fn assert_close(single: &Results, split: &Results, what: &str) {
    let rel = relative(split.ppl, single.ppl);
    assert!(
        rel < 1e-5,
        "{what}: PPL {} vs one rank's {} ({rel:e})",
        split.ppl,
        single.ppl
    );
    assert_eq!(
        split.tokens, single.tokens,
        "{what}: every position scored once"
    );
    assert_eq!(split.windows.len(), single.windows.len());
    for (a, b) in split.windows.iter().zip(&single.windows) {
        assert_eq!((a.index, a.tokens), (b.index, b.tokens), "{what}");
    }
}

#[test]
fn cp2_and_cp3_at_long_context_match_one_rank() {
    let single = eval(&workload("2048", "1", &[]));
    let cp2 = eval(&workload("2048", "1", &["--ranks", "2", "--cp", "2"]));
    assert_close(&single, &cp2, "cp 2, ctx 2048");
    let mesh = cp2.mesh.as_ref().expect("a cp run records its mesh");
    assert_eq!(mesh.dims.cp, 2);
    for r in &mesh.ranks {
        assert_eq!(r.ring_bytes_sent, ring_bytes_per_window(2048, 2, 4));
        assert!(r.bytes_sent >= r.ring_bytes_sent);
    }

    // 2048 does not cut into 6 chunks: cp 3 at 1536.
    let single = eval(&workload("1536", "1", &[]));
    let cp3 = eval(&workload("1536", "1", &["--ranks", "3", "--cp", "3"]));
    assert_close(&single, &cp3, "cp 3, ctx 1536");
    let mesh = cp3.mesh.as_ref().unwrap();
    assert_eq!(mesh.ranks.len(), 3);
    assert!(mesh
        .ranks
        .iter()
        .all(|r| r.ring_bytes_sent == ring_bytes_per_window(1536, 3, 4)));
}

/// ctx 256, 4 windows.
fn short(extra: &[&'static str]) -> Results {
    eval(&workload("256", "4", extra))
}

#[test]
fn cp_composes_with_data_and_pipeline_parallelism_to_the_bit() {
    let single = short(&[]);
    let cp = short(&["--ranks", "2", "--cp", "2"]);
    assert_close(&single, &cp, "cp 2, ctx 256");
    // Not the single rank's bits (the ring adds the softmax in another order), but the same
    // bits for any batch size, data-parallel replica count, pipeline split or schedule.
    for extra in [
        &["--ranks", "2", "--cp", "2", "--batch-size", "3"][..],
        &["--ranks", "4", "--cp", "2", "--dp-replicate", "2"][..],
        &[
            "--ranks",
            "4",
            "--cp",
            "2",
            "--dp-replicate",
            "2",
            "--schedule",
            "dynamic",
        ][..],
        &["--ranks", "4", "--cp", "2", "--pp", "2"][..],
    ] {
        let r = short(extra);
        common::assert_same_numbers(&cp, &r);
    }
    let dp = short(&["--ranks", "4", "--cp", "2", "--dp-replicate", "2"]);
    assert_eq!(
        dp.ranks.len(),
        2,
        "two replicas in the data-parallel protocol"
    );
    let mesh = dp.mesh.as_ref().unwrap();
    // Each replica's ranks sent their blocks for the windows that replica scored.
    let ring: u64 = mesh.ranks.iter().map(|r| r.ring_bytes_sent).sum();
    assert_eq!(ring, 4 * 2 * ring_bytes_per_window(256, 2, 4));
    assert!(mesh.layout.contains("replica 0: stage 0: ranks 0,1"));
}

/// Ranks of `r` whose `weights_bytes` and ring bytes are read below.
fn mesh_ranks(r: &Results) -> &[ppl::report::MeshRank] {
    &r.mesh.as_ref().expect("a cp run records its mesh").ranks
}

#[test]
fn cp_composes_with_tensor_parallelism_within_1e5_and_batch_independent() {
    let single = short(&[]);
    // SmolLM2's 3 KV heads allow tp 3 (tp 2 is refused): a cp group of 2 TP groups of 3.
    let tp = short(&["--ranks", "6", "--cp", "2", "--tp", "3"]);
    assert_close(&single, &tp, "cp 2 × tp 3");
    common::assert_same_numbers(
        &tp,
        &short(&[
            "--ranks",
            "6",
            "--cp",
            "2",
            "--tp",
            "3",
            "--batch-size",
            "3",
        ]),
    );
    let ranks = mesh_ranks(&tp);
    assert_eq!(ranks.len(), 6);
    for r in ranks {
        // Each TP rank passes its own KV head (one of 3) around its ring.
        assert_eq!(
            r.ring_bytes_sent,
            4 * ring_bytes_per_window(256, 2, 4) / 3,
            "rank {}",
            r.rank
        );
    }
    // The cp peers of a TP rank hold the same slice; the TP ranks of a cp rank different ones.
    let by_coords = |cp: usize, tp: usize| {
        ranks
            .iter()
            .find(|r| r.coords.cp == cp && r.coords.tp == tp)
            .expect("every (cp, tp) coordinate has a rank")
    };
    for t in 0..3 {
        assert_eq!(by_coords(0, t).weights_bytes, by_coords(1, t).weights_bytes);
    }
    let whole = mesh_ranks(&short(&["--ranks", "2", "--cp", "2"]))[0].weights_bytes;
    assert!(by_coords(0, 0).weights_bytes < whole);
}

#[test]
fn cp_composes_with_fsdp_to_the_bit() {
    let cp = short(&["--ranks", "2", "--cp", "2"]);
    // FSDP gathers exact weight bytes: the same bits as cp alone, for any batch size.
    let fsdp = short(&["--ranks", "4", "--cp", "2", "--dp-shard", "2"]);
    common::assert_same_numbers(&cp, &fsdp);
    common::assert_same_numbers(
        &cp,
        &short(&[
            "--ranks",
            "4",
            "--cp",
            "2",
            "--dp-shard",
            "2",
            "--batch-size",
            "3",
        ]),
    );
    let ranks = mesh_ranks(&fsdp);
    assert!(
        ranks
            .iter()
            .all(|r| r.weights_bytes < mesh_ranks(&cp)[0].weights_bytes),
        "every rank of a shard group stores part of the blocks"
    );
    let ring: u64 = ranks.iter().map(|r| r.ring_bytes_sent).sum();
    assert_eq!(ring, 4 * 2 * ring_bytes_per_window(256, 2, 4));
    // 5 windows over 2 shard replicas: one replica runs an idle step (it joins the weight
    // gathers, no ring) while the other scores its last window.
    let five = |extra: &[&'static str]| eval(&workload("256", "5", extra));
    let cp5 = five(&["--ranks", "2", "--cp", "2"]);
    let fsdp5 = five(&["--ranks", "4", "--cp", "2", "--dp-shard", "2"]);
    common::assert_same_numbers(&cp5, &fsdp5);
    assert_close(&five(&[]), &fsdp5, "cp 2 × dp_shard 2, 5 windows");
    let mut per_replica: Vec<u64> = [0, 1]
        .iter()
        .map(|&s| {
            mesh_ranks(&fsdp5)
                .iter()
                .filter(|r| r.coords.dp_shard == s)
                .map(|r| r.ring_bytes_sent)
                .sum::<u64>()
                / ring_bytes_per_window(256, 2, 4)
        })
        .collect();
    per_replica.sort_unstable();
    assert_eq!(
        per_replica,
        vec![4, 6],
        "windows × cp ranks per replica: 2·2 and 3·2"
    );
}

#[test]
fn the_summary_states_the_rings_bytes_and_share() {
    let out = ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .args(workload("256", "1", &["--ranks", "2", "--cp", "2"]))
        .args(["--progress", "none"])
        .assert()
        .success()
        .get_output()
        .clone();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("context-parallel ring (cp 2): "))
        .unwrap_or_else(|| panic!("no ring line in:\n{text}"));
    // Every position's keys and values (30 layers × 2 × 3 heads × 64 × 4 bytes) go once
    // around a ring of 2: 46,080 bytes per token; 5.6 MiB per rank for one window of 256.
    assert!(
        line.contains(": 5.6 MiB sent per rank, 46080 B per token"),
        "{line}"
    );
    let share: f64 = line
        .split("; ring ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no share in {line}"));
    assert!((0.0..100.0).contains(&share), "{line}");
}

#[test]
fn compressed_keys_and_values_halve_the_ring_and_stay_close() {
    let exact = short(&["--ranks", "2", "--cp", "2"]);
    let bf16 = short(&["--ranks", "2", "--cp", "2", "--comm-dtype", "bf16"]);
    let rel = relative(bf16.ppl, exact.ppl);
    assert!(
        rel < 2e-2,
        "bf16 ring: {} vs {} ({rel:e})",
        bf16.ppl,
        exact.ppl
    );
    assert_ne!(bf16.ppl.to_bits(), exact.ppl.to_bits(), "bf16 is lossy");
    for r in &bf16.mesh.as_ref().unwrap().ranks {
        assert_eq!(r.ring_bytes_sent, 4 * ring_bytes_per_window(256, 2, 2));
    }
}

#[test]
fn windows_that_do_not_cut_into_chunks_are_refused_before_loading() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--ranks", "3", "--cp", "3", "--ctx", "2048"],
            "--ctx 2048 is not divisible by 6; use --ctx 2046 or 2052",
        ),
        (
            &["--ranks", "4", "--cp", "4", "--ctx", "6"],
            "at least 2·cp = 8 tokens",
        ),
        (
            &["--ranks", "2", "--cp", "2", "--method", "stride"],
            "--cp 2 works with --method chunks only",
        ),
        (
            &["--ranks", "3", "--cp", "2"],
            "world size 3 is not divisible by dp_replicate·cp·tp·pp = 2",
        ),
        (&["--ranks", "2", "--cp", "0"], "at least 1"),
    ];
    for (args, message) in cases {
        common::assert_eval_refused(args, message);
    }
}

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;
    use std::process::Command;

    fn mpirun_eval(np: &str, args: &[&str]) -> Results {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.json");
        let st = Command::new("mpirun")
            .args(["--oversubscribe", "--bind-to", "none", "-np", np])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("PPL_STATE_DIR", std::env::temp_dir().join("ppl-test-state"))
            .arg(assert_cmd::cargo::cargo_bin("ppl"))
            .arg("eval")
            .arg("--model")
            .arg(common::model())
            .arg("--data")
            .arg(common::wikitext())
            .args(["--threads", "1", "--progress", "none", "--output"])
            .arg(&out)
            .args(args)
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "mpirun -np {np} {args:?}: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
    }

    #[test]
    fn mpirun_cp_matches_one_rank_and_the_local_backend() {
        let single = eval(&workload("2048", "1", &[]));
        let cp2 = mpirun_eval("2", &workload("2048", "1", &["--cp", "2"]));
        assert_eq!(cp2.world.backend, "mpi");
        assert_close(&single, &cp2, "mpirun cp 2, ctx 2048");
        // The same arithmetic as the local backend's ranks, to the bit.
        common::assert_same_numbers(
            &eval(&workload("2048", "1", &["--ranks", "2", "--cp", "2"])),
            &cp2,
        );
        let single = eval(&workload("1536", "1", &[]));
        let cp3 = mpirun_eval("3", &workload("1536", "1", &["--cp", "3"]));
        assert_close(&single, &cp3, "mpirun cp 3, ctx 1536");

        let cp = short(&["--ranks", "2", "--cp", "2"]);
        for extra in [
            &["--cp", "2", "--dp-replicate", "2"][..],
            &["--cp", "2", "--pp", "2"][..],
            &["--cp", "2", "--dp-shard", "2"][..],
        ] {
            let r = mpirun_eval("4", &workload("256", "4", extra));
            common::assert_same_numbers(&cp, &r);
        }
    }
}
