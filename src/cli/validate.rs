//! `ppl validate`: a checklist, one line per check with pass/warn/fail and a measured value,
//! run before committing hours of compute. Exit code 0 when nothing failed, 1 otherwise.
//!
//! Checks: CPU features; the model file (readable, architecture, tensor types), the tokenizer,
//! the data; the resolved configuration against the model; memory (planner estimate against
//! what the machine or cgroup allows); the quantizer. With `--distributed` (under `mpirun`,
//! or with `--ranks N` locally): every rank reachable, the communication library, ping-pong
//! latency and bandwidth between rank 0 and every other rank, all-reduce timings from 1 KiB
//! to 64 MiB, and the same model/data/tokenizer/options fingerprints on every rank.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;

use super::EvalArgs;
use crate::comm::{agreement, Communicator};
use crate::model::{gguf, memory, GgufFile, LlamaConfig};
use crate::tokenize::Tokenizer;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    eval: EvalArgs,
    /// Also check the ranks: reachability, latency, bandwidth, fingerprints.
    #[arg(long)]
    distributed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Pass,
    Warn,
    Fail,
}

struct Check {
    status: Status,
    name: String,
    value: String,
}

#[derive(Default)]
struct Checklist(Vec<Check>);

impl Checklist {
    fn add(&mut self, status: Status, name: &str, value: impl Into<String>) {
        self.0.push(Check {
            status,
            name: name.to_string(),
            value: value.into(),
        });
    }
    fn print(&self) {
        for c in &self.0 {
            let s = match c.status {
                Status::Pass => "PASS",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("{s}  {:<24} {}", c.name, c.value);
        }
        let fails = self.0.iter().filter(|c| c.status == Status::Fail).count();
        let warns = self.0.iter().filter(|c| c.status == Status::Warn).count();
        println!(
            "{} checks: {} passed, {} warnings, {} failed",
            self.0.len(),
            self.0.len() - fails - warns,
            warns,
            fails
        );
    }
    fn failed(&self) -> bool {
        self.0.iter().any(|c| c.status == Status::Fail)
    }
}

/// The single-process checks.
fn local_checks(args: &ValidateArgs, list: &mut Checklist) {
    let features = crate::fingerprint::cpu_features();
    let kernels = crate::model::kernels::isa_choice();
    let simd = kernels.used >= crate::model::kernels::Isa::Avx2;
    list.add(
        if (simd || cfg!(not(target_arch = "x86_64"))) && !kernels.failed_to_execute() {
            Status::Pass
        } else {
            Status::Warn
        },
        "CPU features",
        format!(
            "{}; kernels: {}",
            if features.is_empty() {
                "none detected".to_string()
            } else {
                features.join(" ")
            },
            crate::model::kernels::kernels_summary()
        ),
    );
    let resolved = match args.eval.resolve() {
        Ok(mut r) => {
            // Under a launcher the world is the launcher's, as `eval` will find it.
            if args.eval.backend() == super::Backend::Mpi && !r.ranks_given {
                if let Some(n) = crate::comm::launcher::world_size() {
                    r.eval.ranks = n;
                }
            }
            list.add(
                Status::Pass,
                "configuration",
                format!(
                    "ctx {}, method {}, precision {}, batch {}, {} rank(s)",
                    r.eval.ctx, r.eval.method, r.eval.precision, r.eval.batch_size, r.eval.ranks
                ),
            );
            r
        }
        Err(e) => {
            list.add(Status::Fail, "configuration", format!("{e:#}"));
            return;
        }
    };
    let cfg = &resolved.eval;
    let g = match GgufFile::open(&cfg.model) {
        Ok(g) => {
            list.add(
                Status::Pass,
                "model file",
                format!(
                    "{} ({}, {})",
                    cfg.model.display(),
                    memory::mib(g.file_bytes()),
                    if g.is_hf() {
                        format!(
                            "Hugging Face checkpoint, {} safetensors file(s)",
                            g.file_count()
                        )
                    } else {
                        format!("GGUF v{}", g.version)
                    }
                ),
            );
            g
        }
        Err(e) => {
            list.add(Status::Fail, "model file", e.to_string());
            return;
        }
    };
    let mc = match LlamaConfig::from_gguf(&g) {
        Ok(mc) => {
            list.add(
                Status::Pass,
                "architecture",
                format!(
                    "{}, {} layers, {:.0}M parameters, context {}",
                    mc.arch,
                    mc.n_layers,
                    mc.parameters() as f64 / 1e6,
                    mc.context_length
                ),
            );
            mc
        }
        Err(e) => {
            list.add(Status::Fail, "architecture", e.to_string());
            return;
        }
    };
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    for t in g.tensors.values() {
        *types.entry(gguf::ggml_type_name(t.type_id)).or_default() += 1;
    }
    list.add(
        Status::Pass,
        "tensor types",
        types
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let tok = match Tokenizer::from_gguf(&g) {
        Ok(t) => {
            list.add(
                Status::Pass,
                "tokenizer",
                format!(
                    "{}{}, {} tokens, BOS {}",
                    t.kind,
                    t.pre
                        .as_ref()
                        .map(|p| format!(" ({p})"))
                        .unwrap_or_default(),
                    t.vocab_size,
                    if t.add_bos { "added" } else { "not added" }
                ),
            );
            t
        }
        Err(e) => {
            list.add(Status::Fail, "tokenizer", e.to_string());
            return;
        }
    };
    match crate::data::load(&cfg.data, &cfg.text_field) {
        Ok(d) => list.add(
            Status::Pass,
            "data",
            format!(
                "{} ({} bytes, UTF-8{})",
                cfg.data.display(),
                d.text.len(),
                d.doc_ranges
                    .as_ref()
                    .map(|r| format!(", {} documents", r.len()))
                    .unwrap_or_default()
            ),
        ),
        Err(e) => list.add(Status::Fail, "data", e.to_string()),
    }
    if cfg.ctx > mc.context_length || cfg.ctx < 2 {
        list.add(
            Status::Fail,
            "context length",
            format!(
                "--ctx {} outside 2..={} (the model's context length)",
                cfg.ctx, mc.context_length
            ),
        );
    } else {
        list.add(
            Status::Pass,
            "context length",
            format!("{} of {}", cfg.ctx, mc.context_length),
        );
    }
    // The mesh, checked against the model as `eval` will before loading.
    let mut parts: Vec<crate::model::Partition> = Vec::new();
    match cfg
        .dims(cfg.ranks)
        .and_then(|d| crate::run::check_plan(cfg, &d, &g, &mc).map(|_| d))
    {
        Ok(dims) if dims.splits_model() => {
            for r in 0..dims.world() {
                let p = crate::run::partition(&dims, r, &mc);
                if !parts.contains(&p) {
                    parts.push(p);
                }
            }
            let per_rank: Vec<u64> = (0..dims.world())
                .map(|r| {
                    memory::partition_weight_bytes(
                        &g,
                        cfg.precision,
                        &crate::run::partition(&dims, r, &mc),
                    )
                })
                .collect();
            list.add(
                Status::Pass,
                "mesh",
                format!(
                    "dp_replicate={} dp_shard={} tp={} pp={} on {} ranks; weights per rank {} to {} (whole model {})",
                    dims.dp_replicate,
                    dims.dp_shard,
                    dims.tp,
                    dims.pp,
                    dims.world(),
                    memory::mib(per_rank.iter().copied().min().unwrap_or(0)),
                    memory::mib(per_rank.iter().copied().max().unwrap_or(0)),
                    memory::mib(memory::weight_bytes(&g, cfg.precision)),
                ),
            );
        }
        Ok(dims) => list.add(
            Status::Pass,
            "mesh",
            format!(
                "data parallel, {} rank(s), each with the whole model",
                dims.world()
            ),
        ),
        Err(e) => list.add(Status::Fail, "mesh", e.to_string()),
    }
    let est = memory::estimate(
        &g,
        &mc,
        cfg.precision,
        cfg.batch_size,
        cfg.positions_per_rank(),
        cfg.ranks,
        tok.vocab_size,
        &parts,
    );
    match memory::available_bytes() {
        Some((avail, source)) => {
            let status = if est.total_bytes > avail {
                Status::Fail
            } else if est.total_bytes * 5 > avail * 4 {
                Status::Warn
            } else {
                Status::Pass
            };
            list.add(
                status,
                "memory",
                format!(
                    "need about {} of {} available ({source})",
                    memory::mib(est.total_bytes),
                    memory::mib(avail)
                ),
            );
        }
        None => list.add(
            Status::Warn,
            "memory",
            format!(
                "need about {}; available memory unknown",
                memory::mib(est.total_bytes)
            ),
        ),
    }
    match cfg.quantize {
        None => list.add(
            Status::Pass,
            "quantizer",
            "none requested (weights used as stored)",
        ),
        Some(q) => list.add(
            Status::Pass,
            "quantizer",
            format!(
                "{}{} at load: block linears{}{}",
                q.scheme,
                if q.scheme == crate::model::Scheme::Int4 {
                    format!(" (groups of {})", q.group_size)
                } else {
                    String::new()
                },
                if q.output { ", output layer" } else { "" },
                if q.embeddings { ", embeddings" } else { "" },
            ),
        ),
    }
}

/// Milliseconds, with sensible precision.
fn ms(s: f64) -> String {
    format!("{:.3} ms", s * 1e3)
}

/// The checks that involve every rank; only rank 0 records lines.
fn distributed_checks(
    comm: &dyn Communicator,
    args: &ValidateArgs,
    library: &str,
    list: &mut Checklist,
) -> Result<(), crate::comm::CommError> {
    let root = comm.rank() == 0;
    let t = Instant::now();
    let hosts = comm.all_gather(comm.host().into_bytes())?;
    if root {
        let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
        for h in &hosts {
            *per_host
                .entry(String::from_utf8_lossy(h).into_owned())
                .or_default() += 1;
        }
        let spread = per_host
            .iter()
            .map(|(h, n)| format!("{h}×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        list.add(
            Status::Pass,
            "ranks reachable",
            format!(
                "{} ranks ({spread}) in {}",
                comm.size(),
                ms(t.elapsed().as_secs_f64())
            ),
        );
        list.add(
            Status::Pass,
            "communication",
            format!("{} backend: {library}", comm.backend()),
        );
    }
    // Ping-pong between rank 0 and each other rank.
    for size in [1usize << 10, 1 << 20, 64 << 20] {
        let payload = vec![0x5a_u8; size];
        let mut worst: f64 = 0.0;
        for peer in 1..comm.size() {
            let reps = if size >= 64 << 20 { 2 } else { 10 };
            if root {
                let t = Instant::now();
                for _ in 0..reps {
                    comm.send(peer, 20, payload.clone())?;
                    comm.recv(peer, 21)?;
                }
                worst = worst.max(t.elapsed().as_secs_f64() / reps as f64 / 2.0);
            } else if comm.rank() == peer {
                for _ in 0..reps {
                    let m = comm.recv(0, 20)?;
                    comm.send(0, 21, m)?;
                }
            }
        }
        if root && comm.size() > 1 {
            let mbps = size as f64 / worst / 1e6;
            list.add(
                Status::Pass,
                &format!("ping-pong {}", human(size)),
                format!("one way {} (slowest peer), {mbps:.1} MB/s", ms(worst)),
            );
        }
    }
    for size in [1usize << 10, 1 << 20, 64 << 20] {
        comm.barrier()?;
        let values = vec![1i128; size / 16];
        let t = Instant::now();
        let sum = comm.all_reduce_sum_i128(&values)?;
        let secs = t.elapsed().as_secs_f64();
        if root {
            let ok = sum.len() == values.len() && sum.iter().all(|&v| v == comm.size() as i128);
            list.add(
                if ok { Status::Pass } else { Status::Fail },
                &format!("all-reduce {}", human(size)),
                format!(
                    "{} for {} ranks (exact integer sum{})",
                    ms(secs),
                    comm.size(),
                    if ok { "" } else { " WRONG" }
                ),
            );
        }
    }
    // Fingerprints, through the same agreement the evaluation runs.
    let resolved = match args.eval.resolve() {
        Ok(r) => r,
        Err(e) => {
            if root {
                list.add(Status::Fail, "fingerprints", format!("{e:#}"));
            }
            return Ok(());
        }
    };
    match crate::run::fingerprints(comm, &resolved.eval, &resolved.eval.data) {
        Ok(mine) => match agreement::check(comm, &mine) {
            Ok(()) => {
                if root {
                    list.add(
                        Status::Pass,
                        "fingerprints",
                        format!(
                            "same model, data, tokenizer and options on all {} ranks",
                            comm.size()
                        ),
                    );
                }
            }
            Err(e) => {
                if root {
                    list.add(Status::Fail, "fingerprints", e.to_string());
                }
            }
        },
        Err(e) => {
            if root {
                list.add(Status::Fail, "fingerprints", e.to_string());
            }
        }
    }
    Ok(())
}

fn human(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let mut list = Checklist::default();
    let mpi = args.eval.backend() == super::Backend::Mpi;
    // Under a launcher every rank runs this; one checklist is printed (rank 0's).
    let mut is_root = !mpi || crate::comm::launcher::world_rank().unwrap_or(0) == 0;
    if !mpi || !args.distributed {
        local_checks(&args, &mut list);
    }
    if args.distributed {
        if mpi {
            let (comm, library) = super::dispatch::mpi_comm()?;
            is_root = comm.rank() == 0;
            if is_root {
                local_checks(&args, &mut list);
            }
            if let Err(e) = distributed_checks(comm.as_ref(), &args, &library, &mut list) {
                list.add(Status::Fail, "communication", format!("{e}; check the network and firewall between the nodes, then re-run `ppl validate --distributed`"));
            }
        } else {
            let n = args.eval.ranks.unwrap_or(2).max(1);
            let comms = crate::comm::local::world(n);
            let lists: Vec<Checklist> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let args = &args;
                        s.spawn(move || {
                            let mut l = Checklist::default();
                            if let Err(e) =
                                distributed_checks(c, args, "threads of this process", &mut l)
                            {
                                l.add(Status::Fail, "communication", e.to_string());
                            }
                            l
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_default())
                    .collect()
            });
            if let Some(first) = lists.into_iter().next() {
                list.0.extend(first.0);
            }
        }
    }
    if is_root {
        list.print();
    }
    Ok(if list.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
