//! `ppl bench`: the reference throughput workload (default: SmolLM2 Q4_1, wikitext, ctx 512,
//! 8 chunks), each configuration in its own child process so peak RSS is per configuration.
//! Configurations run alternately (`--repeat` rounds) and the median is reported; with
//! `--llama-perplexity BIN` the same workload also runs through llama.cpp and the median of
//! the per-round wall-time ratios is printed. Before the first round the model files are
//! read through once, so that every round finds them in the page cache: otherwise the first
//! process of round 0 (ppl's) alone pays for reading a cold file from disk, which cost ppl 4 s
//! of a 10 s round on a 2 GB model (2026-12-06) and skewed that round's ratio.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use crate::model::{fetch, Precision};
use crate::report::Results;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// GGUF model [default: the fetched SmolLM2 test model].
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Text file [default: ../shared/data/wikitext-2-raw/wiki.test.raw].
    #[arg(short = 'f', long)]
    data: Option<PathBuf>,
    #[arg(short, long, default_value_t = 512)]
    ctx: usize,
    #[arg(long, default_value_t = 8)]
    chunks: usize,
    /// Compute threads [default: all cores].
    #[arg(short, long)]
    threads: Option<usize>,
    #[arg(short, long, default_value_t = 1)]
    batch_size: usize,
    /// Precisions to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Precision::Native, Precision::F32])]
    precision: Vec<Precision>,
    /// Rounds; each round runs every configuration once.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// A llama.cpp `llama-perplexity` binary to run on the same workload, alternately.
    #[arg(long)]
    llama_perplexity: Option<PathBuf>,
    /// Model for llama-perplexity [default: --model].
    #[arg(long)]
    llama_model: Option<PathBuf>,
    /// Write the measurements as JSON.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Measurement {
    tool: String,
    precision: Option<Precision>,
    round: usize,
    wall_s: f64,
    eval_s: Option<f64>,
    tokens: usize,
    tokens_per_s_eval: Option<f64>,
    tokens_per_s_wall: f64,
    seconds_per_chunk: f64,
    peak_rss_bytes: Option<u64>,
    ppl: Option<f64>,
    /// The kernels the run used, as the tool says: ppl's level and how it was chosen
    /// (results.json `system.kernels.summary`), llama.cpp's `system_info` line.
    kernels: Option<String>,
}

#[derive(Debug, Serialize)]
struct BenchReport {
    model: String,
    data: String,
    ctx: usize,
    chunks: usize,
    threads: usize,
    batch_size: usize,
    cpu_features: Vec<&'static str>,
    measurements: Vec<Measurement>,
    /// Median over rounds of (llama.cpp wall time / ppl wall time), per ppl precision.
    median_speedup_vs_llama_cpp: Vec<(Precision, f64)>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let model = match args.model {
        Some(m) => m,
        None => fetch::fetch_test_model(&fetch::cache_dir())?,
    };
    let data = args
        .data
        .unwrap_or_else(|| PathBuf::from("../shared/data/wikitext-2-raw/wiki.test.raw"));
    if !data.is_file() {
        bail!(
            "data file {} not found; pass it with --data",
            data.display()
        );
    }
    let threads = args.threads.unwrap_or_else(super::default_threads);
    let exe = std::env::current_exe().context("cannot locate the ppl executable")?;
    let tokens = args.ctx * args.chunks;
    let tmp = tempdir()?;
    let llama_model = args.llama_model.as_ref().unwrap_or(&model);
    let mut files = vec![&model];
    if args.llama_perplexity.is_some() && llama_model != &model {
        files.push(llama_model);
    }
    for file in files
        .into_iter()
        .flat_map(|m| model_files(m))
        .collect::<Vec<_>>()
    {
        let t = Instant::now();
        let bytes = read_through(&file)?;
        eprintln!(
            "warm-up: read {} ({} MiB) in {:.2} s, so that every round finds it in the page cache",
            file.display(),
            bytes >> 20,
            t.elapsed().as_secs_f64()
        );
    }
    let mut ms = Vec::new();
    for round in 0..args.repeat.max(1) {
        for &p in &args.precision {
            let out = tmp.join(format!("r{round}-{p}.json"));
            let t = Instant::now();
            let st = Command::new(&exe)
                .arg("eval")
                .arg("--model")
                .arg(&model)
                .arg("--data")
                .arg(&data)
                .args([
                    "--ctx",
                    &args.ctx.to_string(),
                    "--chunks",
                    &args.chunks.to_string(),
                ])
                .args([
                    "--threads",
                    &threads.to_string(),
                    "--batch-size",
                    &args.batch_size.to_string(),
                ])
                .args(["--precision", &p.to_string(), "--quiet", "--output"])
                .arg(&out)
                // The ledger goes with the measurement into the temporary directory: a
                // benchmark leaves nothing behind.
                .arg("--run-dir")
                .arg(tmp.join(format!("run-{round}-{p}")))
                .status()?;
            let wall = t.elapsed().as_secs_f64();
            if !st.success() {
                bail!("ppl eval failed for precision {p}");
            }
            let r: Results = serde_json::from_slice(&std::fs::read(&out)?)?;
            let m = Measurement {
                tool: "ppl".into(),
                precision: Some(p),
                round,
                wall_s: wall,
                eval_s: Some(r.timings.eval_s),
                tokens,
                tokens_per_s_eval: Some(r.timings.tokens_per_s),
                tokens_per_s_wall: tokens as f64 / wall,
                seconds_per_chunk: r.timings.eval_s / args.chunks as f64,
                peak_rss_bytes: r.system.peak_rss_bytes,
                ppl: Some(r.ppl),
                kernels: r.system.kernels.as_ref().map(|k| k.summary.clone()),
            };
            eprintln!(
                "round {round} ppl {p}: {:.1} tok/s (eval), {:.2} s/chunk, wall {wall:.2} s, peak RSS {} MiB, PPL {:.4}",
                r.timings.tokens_per_s,
                m.seconds_per_chunk,
                r.system.peak_rss_bytes.unwrap_or(0) / (1 << 20),
                r.ppl
            );
            ms.push(m);
        }
        if let Some(bin) = &args.llama_perplexity {
            let lm = llama_model;
            let t = Instant::now();
            let out = Command::new("/usr/bin/time")
                .arg("-f")
                .arg("PPL_MAXRSS_KB=%M")
                .arg(bin)
                .arg("-m")
                .arg(lm)
                .arg("-f")
                .arg(&data)
                .args([
                    "-c",
                    &args.ctx.to_string(),
                    "--chunks",
                    &args.chunks.to_string(),
                ])
                .args(["-t", &threads.to_string(), "-b", &args.ctx.to_string()])
                .output()
                .with_context(|| format!("cannot run {} under /usr/bin/time", bin.display()))?;
            let wall = t.elapsed().as_secs_f64();
            let log = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                bail!("llama-perplexity failed:\n{log}");
            }
            let rss = log
                .lines()
                .find_map(|l| l.strip_prefix("PPL_MAXRSS_KB="))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|kb| kb * 1024);
            let ppl = log
                .lines()
                .find_map(|l| l.split("Final estimate: PPL = ").nth(1))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok());
            let system_info = llama_system_info(&log);
            eprintln!(
                "round {round} llama.cpp: {:.1} tok/s (wall {wall:.2} s), PPL {ppl:?}",
                tokens as f64 / wall
            );
            ms.push(Measurement {
                tool: "llama.cpp".into(),
                precision: None,
                round,
                wall_s: wall,
                eval_s: None,
                tokens,
                tokens_per_s_eval: None,
                tokens_per_s_wall: tokens as f64 / wall,
                seconds_per_chunk: wall / args.chunks as f64,
                peak_rss_bytes: rss,
                ppl,
                kernels: system_info,
            });
        }
    }
    let mut speedups = Vec::new();
    if args.llama_perplexity.is_some() {
        for &p in &args.precision {
            let ratios: Vec<f64> = (0..args.repeat.max(1))
                .filter_map(|round| {
                    let ours = ms
                        .iter()
                        .find(|m| m.round == round && m.precision == Some(p))?;
                    let theirs = ms
                        .iter()
                        .find(|m| m.round == round && m.tool == "llama.cpp")?;
                    Some(theirs.wall_s / ours.wall_s)
                })
                .collect();
            if !ratios.is_empty() {
                speedups.push((p, median(ratios)));
            }
        }
    }
    println!(
        "{:<10} {:>9} {:>14} {:>14} {:>11} {:>12}",
        "tool", "precision", "tok/s (eval)", "tok/s (wall)", "s/chunk", "peak RSS MiB"
    );
    for m in &ms {
        println!(
            "{:<10} {:>9} {:>14} {:>14.1} {:>11.2} {:>12}",
            m.tool,
            m.precision.map_or("-".to_string(), |p| p.to_string()),
            m.tokens_per_s_eval
                .map_or("-".to_string(), |t| format!("{t:.1}")),
            m.tokens_per_s_wall,
            m.seconds_per_chunk,
            m.peak_rss_bytes
                .map_or("-".to_string(), |b| (b >> 20).to_string())
        );
    }
    for (p, s) in &speedups {
        println!("median speed-up of ppl ({p}) over llama.cpp, wall time: {s:.2}x");
    }
    let report = BenchReport {
        model: model.display().to_string(),
        data: data.display().to_string(),
        ctx: args.ctx,
        chunks: args.chunks,
        threads,
        batch_size: args.batch_size,
        cpu_features: crate::fingerprint::cpu_features(),
        measurements: ms,
        median_speedup_vs_llama_cpp: speedups,
    };
    if let Some(o) = &args.output {
        std::fs::write(o, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", o.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// llama.cpp's `system_info` line in its log (the instruction sets and kernels it built and
/// uses, e.g. `AVX512 = 1 | … | AMX_INT8 = 1 | REPACK = 1`), without the log's prefix.
fn llama_system_info(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        l.split_once("system_info: ")
            .map(|(_, info)| info.trim().to_string())
    })
}

/// The files a model is read from: a GGUF file itself, or the regular files of a Hugging
/// Face checkpoint directory (its safetensors shards, config and tokenizer); a path that is
/// neither is returned as it is, for [`read_through`] to name.
fn model_files(model: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(model) else {
        return vec![model.to_path_buf()];
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Reads `path` from start to end (into a reused buffer, nothing kept), which leaves its
/// pages in the page cache where memory allows; returns the bytes read.
fn read_through(path: &Path) -> anyhow::Result<u64> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).with_context(|| {
        format!(
            "cannot open the model file {}: pass an existing GGUF file or checkpoint directory with --model",
            path.display()
        )
    })?;
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("cannot read the model file {}", path.display()))?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// The benchmark's scratch directory (results and ledgers of its runs), removed when the
/// benchmark ends, however it ends.
struct ScratchDir(PathBuf);

impl std::ops::Deref for ScratchDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> anyhow::Result<ScratchDir> {
    let d = std::env::temp_dir().join(format!("ppl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(ScratchDir(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpps_system_info_line_is_found_without_its_prefix() {
        let log = "0.00.001.000 I build: 1 (abc)\n\
            0.00.274.077 I system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | \n\
            0.02.520.275 I Final estimate: PPL = 12.8254 +/- 2.47921\n";
        assert_eq!(
            llama_system_info(log).as_deref(),
            Some("n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
        );
        assert_eq!(llama_system_info("Final estimate: PPL = 1.0\n"), None);
    }

    #[test]
    fn the_warm_up_reads_every_byte_of_a_model_and_names_a_missing_one() {
        let dir = tempdir().unwrap();
        let path = dir.join("model.gguf");
        // Larger than the buffer and not a multiple of it: the last partial read counts.
        let len = (8 << 20) + 12_345;
        std::fs::write(&path, vec![7u8; len]).unwrap();
        assert_eq!(read_through(&path).unwrap(), len as u64);
        // A checkpoint directory is read file by file; a file is itself.
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        assert_eq!(
            model_files(&dir),
            vec![dir.join("config.json"), dir.join("model.gguf")]
        );
        assert_eq!(model_files(&path), vec![path.clone()]);
        let missing = dir.join("absent.gguf");
        assert_eq!(model_files(&missing), vec![missing.clone()]);
        let err = format!("{:#}", read_through(&missing).unwrap_err());
        assert!(err.contains("absent.gguf"), "{err}");
    }
}
