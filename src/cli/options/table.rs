//! The option table: one row per `ppl eval` option. Rows with a key are in the order their
//! keys are written as YAML, each section's keys together.

use super::DefaultValue::{Described, Value};
use super::{names, path_scalar, quantizer_type, quantizer_types, scalar, EvalOption, Kind, ROW};
use crate::comm::codec::CommDtype;
use crate::comm::TpBackend;
use crate::data::Method;
use crate::model::Precision;
use crate::parallel::schedule::Schedule;
use crate::task::{Task, WindowSource};

pub const TASK: EvalOption = EvalOption {
    flag: Some("task"),
    key: Some("task"),
    kind: Kind::Choice(names::<Task>),
    help: "A benchmark task reproduced exactly: wikitext (lm-evaluation-harness; rolling windows of the model's maximum length unless --ctx is given), gptq (the GPTQ reference code's perplexity that quantization papers print: --data wikitext-2/ptb/c4 joined as it joins them, disjoint windows of 2048 unless --ctx is given).",
    yaml: Some(|v| v.resolved.eval.task.map(|t| t.name.to_string())),
    ..ROW
};

pub const MODEL: EvalOption = EvalOption {
    flag: Some("model"),
    key: Some("model.path"),
    kind: Kind::Path,
    help: "Model: a GGUF file, a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json), or a hub name: hf:ORG/NAME[@REVISION] (a checkpoint) or hf:ORG/NAME-GGUF:QUANT (or :FILE.gguf), through the Hugging Face cache.",
    yaml: Some(|v| Some(path_scalar(&v.resolved.eval.model))),
    ..ROW
};

/// What `model.path` is: a file states it so that it is checked against the path.
pub const MODEL_FORMAT: EvalOption = EvalOption {
    key: Some("model.format"),
    kind: Kind::Choice(|| vec!["gguf".into(), "safetensors".into()]),
    one_sided: "--model's path says what it is (a file or a checkpoint directory); a configuration file states it to have it checked",
    yaml: Some(|v| {
        Some(if v.resolved.eval.model.is_dir() {
            "safetensors".into()
        } else {
            "gguf".into()
        })
    }),
    ..ROW
};

pub const DATA: EvalOption = EvalOption {
    flag: Some("data"),
    key: Some("data.path"),
    kind: Kind::Path,
    help: "The text: a UTF-8 file, a .jsonl/.ndjson or .parquet file (one document per record or row), a directory of them, - for standard input, or a dataset name: wikitext-2[:SPLIT], wikitext-103, ptb, c4 (ppl data list).",
    yaml: Some(|v| Some(path_scalar(&v.resolved.eval.data))),
    ..ROW
};

pub const METHOD: EvalOption = EvalOption {
    flag: Some("method"),
    key: Some("data.method"),
    kind: Kind::Choice(names::<Method>),
    default: Value("chunks"),
    help: "How the text is cut into windows.",
    yaml: Some(|v| Some(v.resolved.eval.method.to_string())),
    ..ROW
};

pub const TEXT_FIELD: EvalOption = EvalOption {
    flag: Some("text-field"),
    key: Some("data.text_field"),
    kind: Kind::Str,
    default: Value("text"),
    help: "The field of each JSON Lines record (--data F.jsonl), or the Parquet column, holding its text.",
    yaml: Some(|v| Some(scalar(&v.resolved.eval.text_field))),
    ..ROW
};

pub const STRIDE: EvalOption = EvalOption {
    flag: Some("stride"),
    key: Some("data.stride"),
    kind: Kind::at_least(1),
    default: Described("ctx/2"),
    help: "Step between window starts for --method stride.",
    yaml: Some(|v| {
        let e = &v.resolved.eval;
        (e.method == Method::Stride).then(|| e.stride.to_string())
    }),
    ..ROW
};

pub const CHUNKS: EvalOption = EvalOption {
    flag: Some("chunks"),
    key: Some("data.chunks"),
    kind: Kind::Int {
        min: 1,
        minus_one: true,
    },
    default: Described("all"),
    help: "Score at most N windows (chunks, stride) or N documents (rolling); -1 in a configuration file: all.",
    yaml: Some(|v| Some(v.resolved.eval.chunks.map_or(-1, |c| c as i64).to_string())),
    ..ROW
};

pub const MAX_TOKENS: EvalOption = EvalOption {
    flag: Some("max-tokens"),
    key: Some("data.max_tokens"),
    kind: Kind::at_least(1),
    default: Described("all"),
    help: "Use only the first N tokens of the text (chunks, stride).",
    yaml: Some(|v| v.resolved.eval.max_tokens.map(|m| m.to_string())),
    ..ROW
};

pub const DP_REPLICATE: EvalOption = EvalOption {
    flag: Some("dp-replicate"),
    key: Some("parallel.dp_replicate"),
    kind: Kind::at_least(1),
    help: "Data-parallel replicas, each holding a whole copy of the model (or of its shards).",
    yaml: Some(|v| {
        let e = &v.resolved.eval;
        Some(
            if e.parallel.any() {
                e.parallel.dp_replicate.unwrap_or(1)
            } else if v.keep_world {
                e.ranks as i64
            } else {
                1
            }
            .to_string(),
        )
    }),
    ..ROW
};

pub const DP_SHARD: EvalOption = EvalOption {
    flag: Some("dp-shard"),
    key: Some("parallel.dp_shard"),
    kind: Kind::Int {
        min: 1,
        minus_one: true,
    },
    help: "FSDP degree: each rank of a shard group stores 1/N of every layer and gathers it just before use; -1 = the ranks left over by the other degrees.",
    yaml: Some(|v| {
        let p = &v.resolved.eval.parallel;
        Some(if p.any() { p.dp_shard.unwrap_or(-1) } else { 1 }.to_string())
    }),
    ..ROW
};

pub const TP: EvalOption = EvalOption {
    flag: Some("tp"),
    key: Some("parallel.tp"),
    kind: Kind::at_least(1),
    help: "Tensor-parallel degree: heads, MLP channels and vocabulary split across N ranks.",
    yaml: Some(|v| Some(v.resolved.eval.parallel.tp.unwrap_or(1).to_string())),
    ..ROW
};

pub const CP: EvalOption = EvalOption {
    flag: Some("cp"),
    key: Some("parallel.cp"),
    kind: Kind::at_least(1),
    help: "Context-parallel degree: each window's positions split across N ranks (ring attention); --ctx must be divisible by 2·N, --method chunks.",
    yaml: Some(|v| Some(v.resolved.eval.parallel.cp.unwrap_or(1).to_string())),
    ..ROW
};

pub const PP: EvalOption = EvalOption {
    flag: Some("pp"),
    key: Some("parallel.pp"),
    kind: Kind::at_least(1),
    help: "Pipeline-parallel degree: the layers split into N consecutive stages.",
    yaml: Some(|v| Some(v.resolved.eval.parallel.pp.unwrap_or(1).to_string())),
    ..ROW
};

pub const COMM_DTYPE: EvalOption = EvalOption {
    flag: Some("comm-dtype"),
    key: Some("parallel.comm_dtype"),
    kind: Kind::Choice(names::<CommDtype>),
    default: Value("f32"),
    help: "Activations between model-parallel ranks: f32 (exact) or compressed.",
    yaml: Some(|v| Some(v.resolved.eval.comm_dtype.to_string())),
    ..ROW
};

pub const TP_BACKEND: EvalOption = EvalOption {
    flag: Some("tp-backend"),
    key: Some("parallel.tp_backend"),
    kind: Kind::Choice(names::<TpBackend>),
    default: Value("host"),
    help: "Where tensor-parallel activations are summed: host (the rank communicator) or nccl (GPU to GPU; needs --device cuda and a build with `--features nccl`).",
    yaml: Some(|v| Some(v.resolved.eval.tp_backend.to_string())),
    ..ROW
};

pub const BATCH_SIZE: EvalOption = EvalOption {
    flag: Some("batch-size"),
    key: Some("evaluation.batch_size"),
    kind: Kind::at_least(1),
    default: Value("1"),
    help: "Windows per forward pass.",
    yaml: Some(|v| Some(v.resolved.eval.batch_size.to_string())),
    ..ROW
};

pub const CTX: EvalOption = EvalOption {
    flag: Some("ctx"),
    key: Some("evaluation.max_seq_len"),
    kind: Kind::at_least(2),
    default: Value("512"),
    help: "Window length in tokens.",
    // A task's window taken from the model is found again on the next run, not pinned.
    yaml: Some(|v| {
        let e = &v.resolved.eval;
        let from_model = e.task.is_some_and(|t| t.window == WindowSource::Model);
        (!from_model).then(|| e.ctx.to_string())
    }),
    ..ROW
};

pub const PRECISION: EvalOption = EvalOption {
    flag: Some("precision"),
    key: Some("evaluation.precision"),
    kind: Kind::Choice(names::<Precision>),
    default: Value("native"),
    help: "native: quantized weights as stored; f32: weights dequantized to f32; bf16/f16: weights and activations in that type.",
    yaml: Some(|v| Some(v.resolved.eval.precision.to_string())),
    ..ROW
};

pub const DEVICE: EvalOption = EvalOption {
    flag: Some("device"),
    key: Some("evaluation.device"),
    // cpu, cuda or cuda:N: parsed as the flag is when the configuration is resolved.
    kind: Kind::Str,
    default: Value("cpu"),
    help: "Where the model runs: cpu, cuda (each rank of a machine on its own GPU) or cuda:N (needs a build with `--features cuda`).",
    yaml: Some(|v| Some(scalar(&v.resolved.eval.device.to_string()))),
    ..ROW
};

pub const THREADS: EvalOption = EvalOption {
    flag: Some("threads"),
    key: Some("evaluation.threads"),
    kind: Kind::at_least(1),
    default: Described("all cores"),
    help: "Compute threads.",
    yaml: Some(|v| Some(v.resolved.eval.threads.to_string())),
    ..ROW
};

pub const SCHEDULE: EvalOption = EvalOption {
    flag: Some("schedule"),
    key: Some("evaluation.schedule"),
    kind: Kind::Choice(names::<Schedule>),
    default: Value("static"),
    help: "How windows are distributed over ranks.",
    yaml: Some(|v| Some(v.resolved.eval.schedule.to_string())),
    ..ROW
};

pub const SEED: EvalOption = EvalOption {
    flag: Some("seed"),
    key: Some("evaluation.seed"),
    kind: Kind::at_least(0),
    default: Value("42"),
    help: "Seed of the bootstrap resampling; rank 0's value is used by every rank.",
    yaml: Some(|v| Some(v.resolved.eval.seed.to_string())),
    ..ROW
};

pub const BOOTSTRAP_SAMPLES: EvalOption = EvalOption {
    flag: Some("bootstrap-samples"),
    key: Some("evaluation.bootstrap_samples"),
    kind: Kind::at_least(0),
    default: Value("1000"),
    help: "Bootstrap replicates for the 95% confidence interval.",
    yaml: Some(|v| Some(v.resolved.eval.bootstrap_samples.to_string())),
    ..ROW
};

pub const QUANTIZE: EvalOption = EvalOption {
    flag: Some("quantize"),
    key: Some("evaluation.quantizer.type"),
    kind: Kind::Choice(quantizer_types),
    default: Described("none"),
    help: "Quantize the weights at load: int4 (asymmetric groups, torchao-style), int8 (per channel), a GGUF type (q4_0, q4_1, q8_0, q4_k, q6_k) or llama.cpp's q4_k_m mix; in a configuration file int4_weight_only, int8_weight_only or the GGUF type.",
    yaml: Some(|v| v.resolved.eval.quantize.map(|q| quantizer_type(q.scheme))),
    ..ROW
};

pub const GROUP_SIZE: EvalOption = EvalOption {
    flag: Some("group-size"),
    key: Some("evaluation.quantizer.groupsize"),
    kind: Kind::at_least(1),
    default: Value("128"),
    help: "Values per int4 group along a row.",
    yaml: Some(|v| v.resolved.eval.quantize.map(|q| q.group_size.to_string())),
    ..ROW
};

pub const QUANTIZE_SKIP: EvalOption = EvalOption {
    flag: Some("quantize-skip"),
    key: Some("evaluation.quantizer.skip"),
    kind: Kind::Choice(|| {
        ["none", "embeddings", "output", "embeddings,output"]
            .map(String::from)
            .to_vec()
    }),
    default: Value("embeddings"),
    help: "Weights --quantize leaves alone: embeddings, output, embeddings,output or none.",
    yaml: Some(|v| {
        v.resolved.eval.quantize.map(|q| {
            match (q.embeddings, q.output) {
                (true, true) => "none",
                (false, true) => "embeddings",
                (true, false) => "output",
                (false, false) => "embeddings,output",
            }
            .to_string()
        })
    }),
    ..ROW
};

/// `--output FILE` and `output.dir` (where `results.json` goes) both say where the results go.
pub const OUTPUT: EvalOption = EvalOption {
    flag: Some("output"),
    key: Some("output.dir"),
    kind: Kind::Path,
    help: "Write results as JSON to this file (written only when the run completes); output.dir in a configuration file: DIR/results.json.",
    yaml: Some(|v| {
        v.resolved.output.as_ref().map(|o| match o.parent() {
            Some(p) => path_scalar(p),
            None => ".".into(),
        })
    }),
    ..ROW
};

pub const REPORT: EvalOption = EvalOption {
    flag: Some("report"),
    key: Some("output.report"),
    kind: Kind::Bool,
    help: "Also write the HTML report [default path: --output with .html, else report.html].",
    yaml: Some(|v| {
        let r = v.resolved;
        r.output.as_ref().map(|_| r.report.is_some().to_string())
    }),
    ..ROW
};

pub const RUN_DIR: EvalOption = EvalOption {
    flag: Some("run-dir"),
    key: Some("output.run_dir"),
    kind: Kind::Path,
    default: Described("a fresh YYYYMMDD-HHMMSS under ~/.local/state/ppl/runs ($XDG_STATE_HOME, $PPL_STATE_DIR); `ppl runs` lists them"),
    help: "Run directory: the ledger of finished windows and the configuration go here.",
    // A saved configuration lives in its run directory: `--resume` names it.
    yaml: Some(|v| {
        let r = v.resolved;
        r.eval
            .run_dir
            .as_ref()
            .filter(|_| v.keep_world)
            .map(|d| path_scalar(d))
    }),
    ..ROW
};

pub const CONFIG: EvalOption = EvalOption {
    flag: Some("config"),
    help: "YAML configuration (flags given here win over it).",
    one_sided: "names the configuration itself",
    ..ROW
};

pub const SET: EvalOption = EvalOption {
    flag: Some("set"),
    help: "Override a configuration key, e.g. --set evaluation.batch_size=8 (repeatable).",
    one_sided: "sets configuration keys itself",
    ..ROW
};

pub const RESUME: EvalOption = EvalOption {
    flag: Some("resume"),
    help: "Resume the run in DIR: windows its ledgers hold are not recomputed. Without --config or --model, the configuration saved in DIR/config.yaml is used (flags still override, e.g. another --ranks or mesh).",
    one_sided: "reads a run directory's saved configuration; output.run_dir names the directory in a file",
    ..ROW
};

pub const EXPECT: EvalOption = EvalOption {
    flag: Some("expect"),
    help: "Compare with a previous results.json: explain a difference larger than its 95% CI (and exit 1).",
    one_sided: "checks one run against another, not part of how a run is made",
    ..ROW
};

pub const RANKS: EvalOption = EvalOption {
    flag: Some("ranks"),
    default: Value("1"),
    help: "Ranks of the local backend: threads sharing one copy of the weights.",
    one_sided: "the world size: in a file, parallel.dp_replicate and the other degrees give it",
    ..ROW
};

pub const BACKEND: EvalOption = EvalOption {
    flag: Some("backend"),
    default: Described("mpi when started by mpirun/srun, else local"),
    help: "Communication backend.",
    one_sided: "follows from how the process was started (mpirun/srun or not)",
    ..ROW
};

pub const PROGRESS: EvalOption = EvalOption {
    flag: Some("progress"),
    default: Value("auto"),
    help: "Progress display on stderr.",
    one_sided: "display only, never part of a run's configuration",
    ..ROW
};

pub const QUIET: EvalOption = EvalOption {
    flag: Some("quiet"),
    help: "No progress and no summary (the JSON file still gets written).",
    one_sided: "display only, never part of a run's configuration",
    ..ROW
};

pub const PRINT_CHUNKS: EvalOption = EvalOption {
    flag: Some("print-chunks"),
    help: "Print llama.cpp-style running values [1]…,[2]… on stdout.",
    one_sided: "display only, never part of a run's configuration",
    ..ROW
};

pub const OVERSUBSCRIBE: EvalOption = EvalOption {
    flag: Some("oversubscribe"),
    help: "Allow more local ranks than 4 per core (each rank keeps its own tokenizer, text and windows).",
    one_sided: "a guard of this machine's cores, not part of a run's configuration",
    ..ROW
};

pub const DEBUG_RANK_DATA: EvalOption = EvalOption {
    flag: Some("debug-rank-data"),
    help: "Testing aid: rank R reads PATH instead of --data (simulates a node with another file).",
    one_sided: "a testing aid",
    ..ROW
};

/// Every option; rows with a key in YAML order.
pub const EVAL_OPTIONS: &[EvalOption] = &[
    TASK,
    MODEL,
    MODEL_FORMAT,
    DATA,
    METHOD,
    TEXT_FIELD,
    STRIDE,
    CHUNKS,
    MAX_TOKENS,
    DP_REPLICATE,
    DP_SHARD,
    TP,
    CP,
    PP,
    COMM_DTYPE,
    TP_BACKEND,
    BATCH_SIZE,
    CTX,
    PRECISION,
    DEVICE,
    THREADS,
    SCHEDULE,
    SEED,
    BOOTSTRAP_SAMPLES,
    QUANTIZE,
    GROUP_SIZE,
    QUANTIZE_SKIP,
    OUTPUT,
    REPORT,
    RUN_DIR,
    CONFIG,
    SET,
    RESUME,
    EXPECT,
    RANKS,
    BACKEND,
    PROGRESS,
    QUIET,
    PRINT_CHUNKS,
    OVERSUBSCRIBE,
    DEBUG_RANK_DATA,
];
