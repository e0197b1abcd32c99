//! Models by name (`--model hf:ORG/NAME…`) through a local stand-in for the Hugging Face Hub
//! (`tests/common/hub_server.rs`, named by `HF_ENDPOINT`) and through a cache laid out by
//! hand as Python's `huggingface_hub` lays it out (`HF_HUB_OFFLINE=1`, no server): the same
//! bits as the local files, one download however many processes ask, downloads resumed after
//! a cut and never read while partial, and errors that say the fix.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::hub_server::{HubServer, Repo};
use common::{assert_same_numbers, eval_model, eval_with, fails, model, ppl_cmd, wikitext};
use ppl::report::Results;

const EVAL: &[&str] = &["--ctx", "64", "--chunks", "3", "--threads", "2"];
const GGUF_REPO: &str = "test-org/SmolLM2-135M-Instruct-GGUF";
const GGUF_FILE: &str = "SmolLM2-135M-Instruct-Q4_1.gguf";

fn model_bytes() -> Vec<u8> {
    std::fs::read(model()).unwrap()
}

fn gguf_repo(bytes: &[u8]) -> Repo {
    Repo::new(
        "models",
        GGUF_REPO,
        vec![
            ("README.md".into(), b"# SmolLM2 GGUF\n".to_vec()),
            (GGUF_FILE.into(), bytes.to_vec()),
            (
                "SmolLM2-135M-Instruct-Q8_0.gguf".into(),
                b"not used".to_vec(),
            ),
        ],
    )
}

/// `ppl` with a fresh hub cache and the server as the endpoint (no token, online).
fn hub_cmd(cache: &Path, endpoint: &str) -> assert_cmd::Command {
    let mut c = ppl_cmd();
    c.env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", cache.join("home"))
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    c
}

fn eval_named(cache: &Path, endpoint: &str, name: &str, extra: &[(&str, &str)]) -> Results {
    let mut c = hub_cmd(cache, endpoint);
    for (k, v) in extra {
        c.env(k, v);
    }
    c.args(["eval", "--model", name, "--data"])
        .arg(wikitext())
        .args(EVAL);
    eval_with(c)
}

#[test]
fn a_gguf_by_quantization_gives_the_local_files_bits_and_is_downloaded_once() {
    let bytes = model_bytes();
    let server = HubServer::start(vec![gguf_repo(&bytes)]);
    let cache = tempfile::tempdir().unwrap();
    let local = eval_model(&model(), EVAL);
    let name = format!("hf:{GGUF_REPO}:q4_1");
    let r = eval_named(cache.path(), &server.endpoint, &name, &[]);
    assert_same_numbers(&local, &r);
    assert_eq!(server.downloads_of(&bytes), 1);
    // results.json names the repository and the commit it evaluated.
    let hub = r.model.hub.as_ref().expect("model.hub in results.json");
    assert_eq!(hub.repo, GGUF_REPO);
    assert_eq!(hub.file, GGUF_FILE);
    assert_eq!(hub.commit.len(), 40);
    assert_eq!(r.model.sha256, local.model.sha256);
    // The cache is Python's layout: a relative link from the snapshot to the blob.
    let repo_dir = cache
        .path()
        .join("models--test-org--SmolLM2-135M-Instruct-GGUF");
    let link = repo_dir.join("snapshots").join(&hub.commit).join(GGUF_FILE);
    let target = std::fs::read_link(&link).unwrap();
    let sha = ppl::sha256::of_bytes(&bytes);
    assert_eq!(target, PathBuf::from(format!("../../blobs/{sha}")));
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        hub.commit
    );
    // Again: metadata only, no second download; then offline with the server gone.
    let again = eval_named(cache.path(), &server.endpoint, &name, &[]);
    assert_same_numbers(&local, &again);
    assert_eq!(server.downloads_of(&bytes), 1);
    let offline = eval_named(
        cache.path(),
        "http://127.0.0.1:9",
        &name,
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_same_numbers(&local, &offline);
    // A configuration file names the model and the dataset the same way (not paths
    // relative to the file).
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "model: {{path: \"{name}\"}}\ndata: {{path: \"{}\", method: chunks, chunks: 3}}\nevaluation: {{max_seq_len: 64}}\n",
            wikitext().display()
        ),
    )
    .unwrap();
    let out = cfg_dir.path().join("r.json");
    hub_cmd(cache.path(), &server.endpoint)
        .args(["eval", "--config"])
        .arg(&cfg)
        .args([
            "--threads",
            "2",
            "--progress",
            "none",
            "--quiet",
            "--output",
        ])
        .arg(&out)
        .assert()
        .success();
    let from_yaml: Results = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_same_numbers(&local, &from_yaml);
    // ppl models lists what the hub cache holds.
    hub_cmd(cache.path(), &server.endpoint)
        .arg("models")
        .assert()
        .success()
        .stdout(predicates::str::contains(format!(
            "hf:{GGUF_REPO}:{GGUF_FILE}"
        )));
}

#[test]
fn a_checkpoint_by_name_gives_the_local_directorys_bits() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    ppl_cmd()
        .arg("export")
        .arg(model())
        .args([
            "--dtype",
            "bf16",
            "--format",
            "safetensors",
            "--shard-size",
            "100",
            "-o",
        ])
        .arg(&ckpt)
        .assert()
        .success();
    let mut files = Vec::new();
    for e in std::fs::read_dir(&ckpt).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        files.push((name, std::fs::read(e.path()).unwrap()));
    }
    files.sort();
    let shards = files
        .iter()
        .filter(|f| f.0.ends_with(".safetensors"))
        .count();
    assert!(shards >= 2, "the export is sharded: {shards}");
    files.push(("pytorch_model.bin".into(), b"never fetched".to_vec()));
    let server = HubServer::start(vec![Repo::new("models", "test-org/SmolLM2-bf16", files)]);
    let cache = tempfile::tempdir().unwrap();
    let local = eval_model(&ckpt, EVAL);
    let r = eval_named(
        cache.path(),
        &server.endpoint,
        "hf:test-org/SmolLM2-bf16",
        &[],
    );
    assert_same_numbers(&local, &r);
    assert!(!server.log().iter().any(|l| l.contains("pytorch_model.bin")));
    let hub = r.model.hub.expect("model.hub");
    assert_eq!(
        (hub.repo.as_str(), hub.file.as_str()),
        ("test-org/SmolLM2-bf16", "")
    );
    // A pinned revision reads the same snapshot.
    let pinned = format!("hf:test-org/SmolLM2-bf16@{}", hub.commit);
    let r2 = eval_named(cache.path(), &server.endpoint, &pinned, &[]);
    assert_same_numbers(&local, &r2);
}

/// A cache laid out by hand as huggingface_hub writes it (blobs named by hash, a ref, a
/// relative link), read with HF_HUB_OFFLINE=1 and no server at all.
#[test]
fn a_python_style_cache_is_read_offline() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--someone--SmolLM2-GGUF");
    let sha = ppl::sha256::of_file(&model()).unwrap();
    let commit = "3f1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
    std::fs::copy(model(), repo.join("blobs").join(&sha)).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{sha}"),
        repo.join("snapshots")
            .join(commit)
            .join("smollm2.Q4_1.gguf"),
    )
    .unwrap();
    let local = eval_model(&model(), EVAL);
    let offline = [("HF_HUB_OFFLINE", "1")];
    let r = eval_named(
        cache.path(),
        "http://127.0.0.1:9",
        "hf:someone/SmolLM2-GGUF:Q4_1",
        &offline,
    );
    assert_same_numbers(&local, &r);
    assert_eq!(r.model.hub.unwrap().commit, commit);
    // Offline, and the cache lacks the repository: the error says how to get it.
    let e = fails(
        hub_cmd(cache.path(), "http://127.0.0.1:9").env("HF_HUB_OFFLINE", "1"),
        &["inspect", "hf:someone/Other-GGUF:Q4_0"],
    );
    assert!(
        e.contains("HF_HUB_OFFLINE is set") && e.contains("run once without HF_HUB_OFFLINE"),
        "{e}"
    );
}

#[test]
fn wrong_names_gated_repositories_and_missing_revisions_say_the_fix() {
    let bytes = model_bytes();
    let mut gated = Repo::new(
        "models",
        "test-org/Gated-GGUF",
        vec![(GGUF_FILE.into(), bytes.clone())],
    );
    gated.token = Some("hf_secret".into());
    let server = HubServer::start(vec![gguf_repo(&bytes), gated]);
    let cache = tempfile::tempdir().unwrap();
    let cmd = || hub_cmd(cache.path(), &server.endpoint);
    let e = fails(&mut cmd(), &["inspect", "hf:test-org/No-Such-Model"]);
    assert!(e.contains("'test-org/No-Such-Model' was not found"), "{e}");
    let e = fails(&mut cmd(), &["inspect", &format!("hf:{GGUF_REPO}:Q5_K_M")]);
    assert!(
        e.contains("quantization Q5_K_M")
            && e.contains("SmolLM2-135M-Instruct-Q4_1.gguf, SmolLM2-135M-Instruct-Q8_0.gguf"),
        "{e}"
    );
    let e = fails(&mut cmd(), &["inspect", &format!("hf:{GGUF_REPO}")]);
    assert!(e.contains("holds GGUF files, not a checkpoint"), "{e}");
    let e = fails(&mut cmd(), &["inspect", &format!("hf:{GGUF_REPO}@v9:Q4_1")]);
    assert!(e.contains("revision 'v9' does not exist"), "{e}");
    let e = fails(&mut cmd(), &["inspect", "hf:test-org/Gated-GGUF:Q4_1"]);
    assert!(
        e.contains("gated or private") && e.contains("no token is set") && e.contains("HF_TOKEN"),
        "{e}"
    );
    let e = fails(
        cmd().env("HF_TOKEN", "hf_wrong"),
        &["inspect", "hf:test-org/Gated-GGUF:Q4_1"],
    );
    assert!(e.contains("cannot read it"), "{e}");
    // The token file huggingface-cli writes.
    std::fs::create_dir_all(cache.path().join("home")).unwrap();
    std::fs::write(cache.path().join("home/token"), "hf_secret\n").unwrap();
    cmd()
        .args(["inspect", "hf:test-org/Gated-GGUF:Q4_1"])
        .assert()
        .success()
        .stdout(predicates::str::contains("llama"));
    let e = fails(&mut cmd(), &["inspect", "hf:bad name"]);
    assert!(e.contains("hf:ORG/NAME"), "{e}");
    // The hub unreachable and nothing cached.
    let e = fails(
        &mut hub_cmd(cache.path(), "http://127.0.0.1:9"),
        &["inspect", "hf:x/y:Q4_0"],
    );
    assert!(
        e.contains("cannot reach") && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}

#[test]
fn a_cut_download_resumes_and_is_never_read_while_partial() {
    let bytes = model_bytes();
    let server = HubServer::start(vec![gguf_repo(&bytes)]);
    let cache = tempfile::tempdir().unwrap();
    let name = format!("hf:{GGUF_REPO}:Q4_1");
    // Cut on every try of the first run: it fails, saying so, with nothing in the snapshot.
    server.cut(&bytes, ppl::hub::download::ATTEMPTS);
    let e = fails(
        &mut hub_cmd(cache.path(), &server.endpoint),
        &["inspect", &name],
    );
    assert!(e.contains("cut") || e.contains("stopped at"), "{e}");
    let repo_dir = cache
        .path()
        .join("models--test-org--SmolLM2-135M-Instruct-GGUF");
    assert!(!repo_dir.join("snapshots").exists() || walk(&repo_dir.join("snapshots")).is_empty());
    let sha = ppl::sha256::of_bytes(&bytes);
    let partial = repo_dir.join("blobs").join(format!("{sha}.incomplete"));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept < bytes.len() as u64);
    // The next run resumes from what is there (a range request), and the file is whole.
    server.clear_log();
    hub_cmd(cache.path(), &server.endpoint)
        .args(["inspect", &name])
        .assert()
        .success();
    let log = server.log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("GET /lfs/") && l.ends_with(&format!("bytes={kept}-"))),
        "{log:?}"
    );
    assert_eq!(server.downloads_of(&bytes), 1);
    let blob = repo_dir.join("blobs").join(&sha);
    assert_eq!(ppl::sha256::of_file(&blob).unwrap(), sha);
    assert!(!partial.exists());
    // One cut within a run is resumed by the run itself.
    let cache2 = tempfile::tempdir().unwrap();
    server.cut(&bytes, 1);
    let local = eval_model(&model(), EVAL);
    let r = eval_named(cache2.path(), &server.endpoint, &name, &[]);
    assert_same_numbers(&local, &r);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Several processes naming a model that is not cached (the ranks of an MPI run): one
/// downloads, the others wait on its lock and find the file.
#[test]
fn concurrent_processes_make_one_download() {
    let bytes = Arc::new(model_bytes());
    let server = HubServer::start(vec![gguf_repo(&bytes)]);
    let cache = tempfile::tempdir().unwrap();
    let name = format!("hf:{GGUF_REPO}:Q4_1");
    let children: Vec<std::process::Child> = (0..3)
        .map(|_| {
            let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("ppl"));
            c.env("HF_HUB_CACHE", cache.path())
                .env("HF_ENDPOINT", &server.endpoint)
                .env("HF_HOME", cache.path().join("home"))
                .env_remove("HF_TOKEN")
                .env_remove("HF_HUB_OFFLINE")
                .args(["inspect", &name])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(server.downloads_of(&bytes), 1, "{:?}", server.log());
}
