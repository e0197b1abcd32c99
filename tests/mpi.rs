//! The `mpi` backend under `mpirun` (cargo feature `mpi`; CI installs OpenMPI).
#![cfg(feature = "mpi")]

mod common;

use std::process::Command;

use ppl::report::Results;

fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--bind-to", "none"]);
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

fn ppl() -> String {
    assert_cmd::cargo::cargo_bin("ppl").display().to_string()
}

fn eval_args(data: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        ppl(),
        "eval".into(),
        "--model".into(),
        common::model().display().to_string(),
        "--data".into(),
        data.display().to_string(),
        "--ctx".into(),
        "256".into(),
        "--chunks".into(),
        "12".into(),
        "--precision".into(),
        "f32".into(),
        "--threads".into(),
        "1".into(),
        "--progress".into(),
        "none".into(),
        "--output".into(),
        out.display().to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn mpirun_world_sizes_give_the_single_process_bits() {
    let base = common::eval(&["--ctx", "256", "--chunks", "12", "--precision", "f32"]);
    let dir = tempfile::tempdir().unwrap();
    // mpirun -np 1 is the single process itself; 2 and 3 ranks, both schedules.
    for np in ["2", "3"] {
        for schedule in ["static", "dynamic"] {
            let out = dir.path().join(format!("r{np}{schedule}.json"));
            let st = mpirun()
                .args(["-np", np])
                .args(eval_args(
                    &common::wikitext(),
                    &out,
                    &["--schedule", schedule],
                ))
                .output()
                .unwrap();
            assert!(
                st.status.success(),
                "mpirun -np {np}: {}",
                String::from_utf8_lossy(&st.stderr)
            );
            let r: Results = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
            assert_eq!(r.world.backend, "mpi");
            assert_eq!(r.world.size, np.parse::<usize>().unwrap());
            common::assert_same_numbers(&base, &r);
            assert_eq!(r.ranks.iter().map(|s| s.windows).sum::<usize>(), 12);
        }
    }
}

#[test]
fn mpirun_rank_with_a_different_data_file_stops_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.txt");
    let mut text = std::fs::read_to_string(common::wikitext()).unwrap();
    text.push_str("\nOnly on the second node.\n");
    std::fs::write(&other, text).unwrap();
    let out = dir.path().join("r.json");
    // MPMD launch: rank 0 reads wikitext, rank 1 another file.
    let st = mpirun()
        .args(["-np", "1"])
        .args(eval_args(&common::wikitext(), &out, &[]))
        .arg(":")
        .args(["-np", "1"])
        .args(eval_args(&other, &out, &[]))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success());
    assert!(
        stderr.contains("rank 1 (")
            && stderr.contains("different data file")
            && stderr.contains("other.txt"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn validate_under_mpirun_measures_the_link() {
    let st = mpirun()
        .args(["-np", "2"])
        .arg(ppl())
        .args(["validate", "--distributed", "--model"])
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&st.stderr)
    );
    for line in [
        "PASS  ranks reachable          2 ranks",
        "PASS  communication            mpi backend:",
        "PASS  ping-pong 1 KiB",
        "PASS  all-reduce 64 MiB",
        "PASS  fingerprints",
    ] {
        assert!(stdout.contains(line), "missing '{line}' in:\n{stdout}");
    }
    // Only rank 0 prints the checklist; the configuration is the launcher's world; the MPI
    // library's version is text (no C terminator).
    assert_eq!(stdout.matches("checks:").count(), 1, "{stdout}");
    assert!(stdout.contains(", 2 rank(s)"), "{stdout}");
    assert!(!st.stdout.contains(&0u8), "a NUL byte in:\n{stdout}");

    // Without --distributed: still one checklist, for the world mpirun started.
    let st = mpirun()
        .args(["-np", "2"])
        .arg(ppl())
        .args(["validate", "--model"])
        .arg(common::model())
        .arg("--data")
        .arg(common::wikitext())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&st.stdout);
    assert!(st.status.success(), "{stdout}");
    assert_eq!(stdout.matches("checks:").count(), 1, "{stdout}");
    assert!(stdout.contains(", 2 rank(s)"), "{stdout}");
}

/// The model-parallel workload of `tests/parallel.rs`.
const MESH_WORKLOAD: [&str; 8] = [
    "--ctx",
    "128",
    "--chunks",
    "8",
    "--precision",
    "f32",
    "--batch-size",
    "2",
];

fn mpirun_eval(np: &str, extra: &[&str]) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let mut args: Vec<String> = vec![
        ppl(),
        "eval".into(),
        "--model".into(),
        common::model().display().to_string(),
        "--data".into(),
        common::wikitext().display().to_string(),
        "--threads".into(),
        "1".into(),
        "--progress".into(),
        "none".into(),
        "--output".into(),
        out.display().to_string(),
    ];
    args.extend(MESH_WORKLOAD.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    let st = mpirun().args(["-np", np]).args(&args).output().unwrap();
    assert!(
        st.status.success(),
        "mpirun -np {np} {extra:?}: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

#[test]
fn mpirun_model_parallel_meshes_match_the_local_backend() {
    let mut local_args: Vec<&str> = MESH_WORKLOAD.to_vec();
    local_args.extend(["--threads", "1"]);
    let base = common::eval(&local_args);
    // Pipeline and FSDP: the single-process bits, each rank holding its part.
    for extra in [&["--pp", "2"][..], &["--dp-shard", "2"][..]] {
        let r = mpirun_eval("2", extra);
        assert_eq!(r.world.backend, "mpi");
        common::assert_same_numbers(&base, &r);
        let mesh = r.mesh.expect("mesh figures");
        assert_eq!(mesh.ranks.len(), 2);
        assert!(mesh.ranks.iter().all(|m| m.peak_rss_bytes.is_some()));
    }
    // Data parallel over two pipelines: equal to one pipeline.
    let dp_pp = mpirun_eval("4", &["--dp-replicate", "2", "--pp", "2"]);
    common::assert_same_numbers(&base, &dp_pp);
    // Tensor parallel: the same arithmetic as the local backend's three ranks, to the bit.
    let mut tp_local = local_args.clone();
    tp_local.extend(["--ranks", "3", "--tp", "3"]);
    let tp = mpirun_eval("3", &["--tp", "3"]);
    common::assert_same_numbers(&common::eval(&tp_local), &tp);
    assert!(((tp.ppl - base.ppl) / base.ppl).abs() < 1e-5);
}

#[test]
fn mpirun_refuses_a_mesh_that_does_not_fit_its_world() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let st = mpirun()
        .args(["-np", "2"])
        .args(eval_args(
            &common::wikitext(),
            &out,
            &["--tp", "3", "--dp-shard", "1"],
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success());
    assert!(stderr.contains("but mpirun started 2"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!out.exists());
}

/// The PID of the `ppl` process of MPI rank `rank` whose command line mentions `marker`.
fn rank_pid(rank: usize, marker: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !cmdline.contains(marker) || cmdline.contains("mpirun") {
            return None;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
        environ
            .split(|&b| b == 0)
            .any(|v| v == wanted.as_bytes())
            .then_some(pid)
    })
}

#[test]
fn mpirun_rank_killed_mid_run_ends_the_job_and_resumes_on_another_world() {
    use ppl::eval::ledger;
    let work = ["--ctx", "128", "--chunks", "24", "--precision", "f32"];
    let base = common::eval(&work);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mpi-run");
    let out = tmp.path().join("r.json");
    let mut args = eval_args(&common::wikitext(), &out, &["--run-dir"]);
    args.push(dir.display().to_string());
    args.retain(|a| a != "--ctx" && a != "256" && a != "--chunks" && a != "12");
    args.extend(["--ctx", "128", "--chunks", "24"].map(String::from));
    let mut child = mpirun()
        .args(["-np", "2"])
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let records = |d: &std::path::Path| -> usize {
        ledger::files(d)
            .unwrap_or_default()
            .iter()
            .filter_map(|p| ledger::parse(p, &std::fs::read(p).ok()?).ok())
            .map(|c| c.records.len())
            .sum()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while records(&dir) < 4 {
        assert!(std::time::Instant::now() < deadline, "no progress");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let marker = dir.display().to_string();
    let pid = rank_pid(1, &marker).expect("rank 1's process");
    let killed_at = std::time::Instant::now();
    assert!(Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    // The job ends by itself, promptly, with a failure that names the lost rank.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < end,
            "the job hung after a rank died"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let waited = killed_at.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("rank 1"), "{stderr}");
    assert!(waited < std::time::Duration::from_secs(60), "{waited:?}");
    assert!(!out.exists());
    // Every surviving ledger is readable; resume on one local rank gives the single bits.
    for f in ledger::files(&dir).unwrap() {
        ledger::parse(&f, &std::fs::read(&f).unwrap()).unwrap();
    }
    let resumed = tmp.path().join("resumed.json");
    let st = assert_cmd::Command::cargo_bin("ppl")
        .unwrap()
        .args([
            "eval",
            "--backend",
            "local",
            "--progress",
            "none",
            "--resume",
        ])
        .arg(&dir)
        .arg("--output")
        .arg(&resumed)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let r: Results = serde_json::from_slice(&std::fs::read(&resumed).unwrap()).unwrap();
    common::assert_same_numbers(&base, &r);
    assert!(r.run.unwrap().windows_from_ledger >= 4);
}

#[test]
fn mpirun_compare_gives_the_single_process_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let run = |np: Option<&str>, out: &std::path::Path| {
        let mut args = vec![
            ppl(),
            "compare".into(),
            "--base".into(),
            common::model().display().to_string(),
            "--model".into(),
            common::model().display().to_string(),
            "--data".into(),
            common::wikitext().display().to_string(),
        ];
        args.extend(
            [
                "--ctx",
                "128",
                "--chunks",
                "5",
                "--quantize",
                "q4_0",
                "--threads",
                "1",
                "--quiet",
                "--output",
            ]
            .map(String::from),
        );
        args.push(out.display().to_string());
        let st = match np {
            Some(np) => mpirun().args(["-np", np]).args(&args).output().unwrap(),
            None => Command::new(&args[0]).args(&args[1..]).output().unwrap(),
        };
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
        let ranks = v["ranks"].clone();
        // `run` names each run's own directory.
        for k in ["seconds", "config", "ranks", "rank_stats", "run"] {
            v.as_object_mut().unwrap().remove(k);
        }
        (v, ranks)
    };
    let (one, _) = run(None, &dir.path().join("one.json"));
    let (two, ranks) = run(Some("2"), &dir.path().join("two.json"));
    assert_eq!(ranks, 2);
    assert_eq!(one, two);
}
