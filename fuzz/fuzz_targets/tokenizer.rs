//! Both tokenizers (SmolLM2's byte-level BPE, Gemma 3's SentencePiece) on arbitrary text:
//! encoding never panics, every id is in the vocabulary, and decoding BPE ids gives back the
//! text's bytes, less those the vocabulary cannot spell (SmolLM2 has no token for byte 0x1D,
//! among others: like llama.cpp, the BPE drops a byte without a token). Models from the cache
//! (`ppl fetch-model smollm2` / `gemma3`).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ppl::tokenize::Tokenizer;

fn load(name: &str) -> Option<Tokenizer> {
    let path = ppl::model::fetch::cache_dir().join("models").join(name);
    let g = ppl::model::GgufFile::open(&path).ok()?;
    Tokenizer::from_gguf(&g).ok()
}

fn tokenizers() -> &'static [Tokenizer] {
    static T: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let t: Vec<Tokenizer> = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
            .iter()
            .filter_map(|n| load(n))
            .collect();
        assert!(!t.is_empty(), "no cached model: run `ppl fetch-model` first");
        t
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for (i, tok) in tokenizers().iter().enumerate() {
        if let Ok(ids) = tok.encode_plain(&text) {
            assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size));
            if i == 0 {
                // Byte-level BPE keeps every byte the vocabulary can spell, whatever the
                // merges: the whole text decodes as its characters encoded one by one.
                let mut each = Vec::new();
                for c in text.chars() {
                    each.extend(tok.encode_plain(&c.to_string()).unwrap_or_default());
                }
                assert_eq!(tok.decode(&ids), tok.decode(&each));
            }
        }
        let _ = tok.encode(&text);
    }
});
