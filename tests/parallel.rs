//! Model parallelism on the `local` backend: pipeline stages and FSDP shards give the
//! single-process bits, tensor parallelism agrees within its stated tolerance, combined meshes
//! work, impossible meshes are refused before any weight is loaded, and results.json carries
//! every rank's figures.

mod common;

use common::{eval, ppl_cmd};
use predicates::str::contains;

/// ctx 128, 8 windows, f32 weights, two windows per unit.
const WORKLOAD: [&str; 8] = [
    "--ctx",
    "128",
    "--chunks",
    "8",
    "--precision",
    "f32",
    "--batch-size",
    "2",
];

/// The workload plus `extra` flags (a flag already in the workload gets the new value).
fn with(extra: &[&str]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = WORKLOAD.to_vec();
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    let mut i = 0;
    while i < extra.len() {
        match v.iter().position(|f| *f == extra[i]) {
            Some(p) if extra[i].starts_with("--") && i + 1 < extra.len() => {
                v[p + 1] = leak(extra[i + 1]);
                i += 2;
            }
            _ => {
                v.push(leak(extra[i]));
                i += 1;
            }
        }
    }
    v
}

fn relative(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

#[test]
fn pipeline_stages_give_the_single_process_bits() {
    let base = eval(&with(&[]));
    let pp = eval(&with(&["--ranks", "2", "--pp", "2"]));
    common::assert_same_numbers(&base, &pp);
    let mesh = pp
        .mesh
        .as_ref()
        .expect("a model-parallel run records its mesh");
    assert_eq!(mesh.dims.pp, 2);
    assert_eq!(mesh.ranks.len(), 2);
    // Stage 0 holds blocks 0..17 and the embedding, stage 1 blocks 17..30 and the output
    // layer (which costs about 4 blocks: the stages are balanced by cost).
    assert_eq!(mesh.ranks[0].layers, [0, 17]);
    assert_eq!(mesh.ranks[1].layers, [17, 30]);
    assert!(mesh.ranks[0].embedding && !mesh.ranks[0].output);
    assert!(!mesh.ranks[1].embedding && mesh.ranks[1].output);
    // Activations went from stage 0 to stage 1: 8 windows × 128 positions × 576 f32 values
    // plus the step headers.
    let activations = 8 * 128 * 576 * 4;
    assert!(mesh.ranks[0].bytes_sent >= activations);
    assert!(mesh.ranks[0].bytes_sent < activations + 8 * 200);
    // The HTML report shows the mesh, rank by rank.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pp.json");
    std::fs::write(&json, serde_json::to_vec(&pp).unwrap()).unwrap();
    let html = dir.path().join("pp.html");
    ppl_cmd()
        .arg("report")
        .arg(&json)
        .arg("--output")
        .arg(&html)
        .assert()
        .success();
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(html.contains("Model-parallel mesh"), "no mesh section");
    assert!(html.contains("0–17 + embedding") && html.contains("17–30 + output"));
    // Four pipeline stages on a 30-layer model: 9, 9, 8 and 4 layers; still the same bits.
    let pp4 = eval(&with(&["--ranks", "4", "--pp", "4"]));
    common::assert_same_numbers(&base, &pp4);
    let layers: Vec<[usize; 2]> = pp4.mesh.unwrap().ranks.iter().map(|r| r.layers).collect();
    assert_eq!(layers, vec![[0, 9], [9, 18], [18, 26], [26, 30]]);
}

#[test]
fn fsdp_shards_give_the_single_process_bits_and_hold_half_the_layers() {
    let base = eval(&with(&[]));
    for schedule in ["static", "dynamic"] {
        let r = eval(&with(&[
            "--ranks",
            "2",
            "--dp-shard",
            "2",
            "--schedule",
            schedule,
        ]));
        common::assert_same_numbers(&base, &r);
        let mesh = r.mesh.unwrap();
        assert_eq!(mesh.dims.dp_shard, 2);
        // Both ranks scored windows (two replicas), and each stored half of every layer.
        assert_eq!(r.ranks.len(), 2);
        assert!(r.ranks.iter().all(|s| s.windows > 0), "{:?}", r.ranks);
        let a = mesh.ranks[0].weights_bytes;
        let b = mesh.ranks[1].weights_bytes;
        assert!(a.abs_diff(b) < 4096, "{a} vs {b}");
        // The whole model's bytes: the three tensor-parallel thirds together. An FSDP rank
        // keeps half of every block (as stored) and the whole embedding/output table.
        let whole: u64 = eval(&with(&["--ranks", "3", "--tp", "3"]))
            .mesh
            .unwrap()
            .ranks
            .iter()
            .map(|r| r.weights_bytes)
            .sum();
        assert!((a as f64) < 0.6 * whole as f64, "{a} of {whole}");
    }
    // An uneven split: 3 windows' worth of units over 2 shards, a shard idles while the
    // other finishes, and the bits still match.
    let odd = eval(&with(&[
        "--ranks",
        "2",
        "--dp-shard",
        "2",
        "--batch-size",
        "3",
    ]));
    common::assert_same_numbers(&base, &odd);
}

#[test]
fn tensor_parallel_agrees_within_its_tolerance() {
    // SmolLM2 has 9 heads and 3 KV heads: tp = 3 is the degree that divides both.
    let base = eval(&with(&[]));
    let tp = eval(&with(&["--ranks", "3", "--tp", "3"]));
    assert_eq!(tp.accumulator.count, base.accumulator.count);
    // f32 weights: only the float summation order differs (row-parallel partial sums and the
    // vocabulary split of the log-softmax).
    let rel = relative(tp.ppl, base.ppl);
    assert!(rel < 1e-5, "tp=3 PPL {} vs {} ({rel:e})", tp.ppl, base.ppl);
    assert_ne!(
        tp.accumulator, base.accumulator,
        "a different order, not the same bits"
    );
    for (a, b) in tp.windows.iter().zip(&base.windows) {
        assert!(relative(a.nll_sum, b.nll_sum) < 1e-5);
    }
    // Each rank holds about a third of the weights (embedding, output and blocks all split).
    let mesh = tp.mesh.unwrap();
    let total: u64 = mesh.ranks.iter().map(|r| r.weights_bytes).sum();
    for r in &mesh.ranks {
        let share = r.weights_bytes as f64 / total as f64;
        assert!(
            (share - 1.0 / 3.0).abs() < 0.01,
            "rank {} holds {share}",
            r.rank
        );
    }
    // Each all-reduce sends 2·(tp−1)/tp of the partial sum per rank (reduce-scatter, then
    // all-gather): two per block and one for the embedding, over 8 windows × 128 × 576 f32,
    // plus the NLL partials.
    let sums = (2 * 30 + 1) * 8 * 128 * 576 * 4 * 4 / 3;
    for r in &mesh.ranks {
        // (Row blocks are uneven when 3 does not divide the rows: within 1%.)
        assert!(
            r.bytes_sent >= sums - sums / 100,
            "rank {} sent {} < {sums}",
            r.rank,
            r.bytes_sent
        );
        assert!(
            r.bytes_sent < sums + sums / 20,
            "rank {} sent {} > {sums}",
            r.rank,
            r.bytes_sent
        );
    }
}

#[test]
fn combined_meshes_match_their_single_replica_runs() {
    let pp = eval(&with(&["--ranks", "2", "--pp", "2"]));
    let dp_pp = eval(&with(&["--ranks", "4", "--dp-replicate", "2", "--pp", "2"]));
    common::assert_same_numbers(&pp, &dp_pp);
    assert_eq!(
        dp_pp.ranks.len(),
        2,
        "two replicas in the data-parallel protocol"
    );
    assert_eq!(dp_pp.mesh.as_ref().unwrap().ranks.len(), 4);

    let tp = eval(&with(&["--ranks", "3", "--tp", "3"]));
    let dp_tp = eval(&with(&[
        "--ranks",
        "6",
        "--dp-replicate",
        "2",
        "--tp",
        "3",
        "--schedule",
        "dynamic",
    ]));
    common::assert_same_numbers(&tp, &dp_tp);

    // The seed's layout: 2 replicas × 4 FSDP shards on 8 ranks (dp_shard inferred).
    let base = eval(&with(&[]));
    let seed = eval(&with(&[
        "--ranks",
        "8",
        "--dp-replicate",
        "2",
        "--dp-shard",
        "-1",
    ]));
    common::assert_same_numbers(&base, &seed);
    let dims = seed.mesh.unwrap().dims;
    assert_eq!((dims.dp_replicate, dims.dp_shard), (2, 4));
}

#[test]
fn compressed_activations_change_the_value_and_the_bytes() {
    let exact = eval(&with(&["--ranks", "2", "--pp", "2"]));
    let sent = |r: &ppl::report::Results| r.mesh.as_ref().unwrap().ranks[0].bytes_sent as f64;
    for (dtype, ratio, tolerance) in [
        ("bf16", 0.5, 2e-2),
        ("f16", 0.5, 1e-3),
        ("int8", 0.25, 5e-2),
    ] {
        let r = eval(&with(&["--ranks", "2", "--pp", "2", "--comm-dtype", dtype]));
        let rel = relative(r.ppl, exact.ppl);
        assert!(
            rel < tolerance,
            "{dtype}: {} vs {} ({rel:e})",
            r.ppl,
            exact.ppl
        );
        let bytes = sent(&r) / sent(&exact);
        assert!(
            (bytes - ratio).abs() < 0.02,
            "{dtype}: {bytes} of the f32 bytes"
        );
    }
}

#[test]
fn impossible_meshes_are_refused_with_the_rule_that_failed() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--ranks", "4", "--tp", "3", "--dp-shard", "1"],
            "= 3 ranks, but the world has 4",
        ),
        (
            &["--ranks", "2", "--tp", "2"],
            "does not divide the model's 3 KV heads",
        ),
        (&["--ranks", "2", "--tp", "2"], "use --tp 3"),
        (
            &["--ranks", "31", "--pp", "31"],
            "exceeds the model's 30 layers",
        ),
        (&["--ranks", "3", "--cp", "3"], "is not divisible by 6"),
        (
            &["--ranks", "5", "--dp-replicate", "2", "--dp-shard", "-1"],
            "cannot be inferred",
        ),
    ];
    for (args, message) in cases {
        common::assert_eval_refused(args, message);
    }
    ppl_cmd()
        .args(["eval", "--tp", "0", "--model", "m.gguf", "--data", "d.txt"])
        .assert()
        .failure()
        .stderr(contains("at least 1"));
}
