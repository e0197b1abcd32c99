//! The GGUF reader on arbitrary files: every input is a model or an error, never a panic,
//! and a file that parses also yields its hyper-parameters and tokenizer (or errors).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The reader maps files; a per-process file in /dev/shm keeps that cheap.
    let path = std::path::PathBuf::from(format!("/dev/shm/ppl-fuzz-{}.gguf", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(g) = ppl::model::GgufFile::open(&path) {
        let _ = ppl::model::LlamaConfig::from_gguf(&g);
        let _ = ppl::tokenize::Tokenizer::from_gguf(&g);
        for name in g.tensors.keys().take(4) {
            if let Some(info) = g.tensors.get(name) {
                let _ = g.tensor_data(name, &info.shape.clone());
            }
        }
    }
});
