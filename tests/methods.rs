//! The `stride` and `rolling` windowing methods end to end.

mod common;

use common::eval;

#[test]
fn stride_matches_the_hugging_face_guide_within_0_05_percent() {
    // The guide's loop over the first 20,480 tokens: 79 windows of 512, stride 256, f32.
    let r = eval(&[
        "--method",
        "stride",
        "--ctx",
        "512",
        "--stride",
        "256",
        "--max-tokens",
        "20480",
        "--precision",
        "f32",
        "--batch-size",
        "4",
        "--ranks",
        "2",
        "--threads",
        "2",
    ]);
    let refs = common::reference("smollm2-135m.wikitext2.ppl.json");
    let want = refs["hf_stride"]["ppl_exact_count"].as_f64().unwrap();
    assert_eq!(r.windows.len(), 79);
    assert_eq!(r.tokens, 20_479);
    assert!(
        (r.ppl - want).abs() / want < 0.0005,
        "stride PPL {} vs {want}",
        r.ppl
    );
}

#[test]
fn rolling_scores_every_token_of_every_document_once() {
    let dir = tempfile::tempdir().unwrap();
    let text = " \n = First = \n \n The tower is 324 metres tall , about the same height as an 81 @-@ storey building . \n \n = Second = \n \n It was the tallest man @-@ made structure in the world for 41 years . \n";
    let path = dir.path().join("two-articles.txt");
    std::fs::write(&path, text).unwrap();
    let out = dir.path().join("r.json");
    common::ppl_cmd()
        .arg("eval")
        .arg("--model")
        .arg(common::model())
        .arg("--data")
        .arg(&path)
        .args([
            "--method",
            "rolling",
            "--ctx",
            "16",
            "--precision",
            "f32",
            "--progress",
            "none",
            "--output",
        ])
        .arg(&out)
        .assert()
        .success();
    let r: ppl::report::Results = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(r.data.documents, Some(2));
    let groups: std::collections::BTreeSet<usize> = r.windows.iter().map(|w| w.group).collect();
    assert_eq!(groups.len(), 2);
    // Every document token is scored exactly once: scored tokens == tokens in the stream.
    assert_eq!(r.tokens, r.data.stream_tokens);
    assert!(r.windows.iter().all(|w| w.input_tokens <= 16));
    let bytes = (text.len() - " \n".len()) as f64; // the blank preamble is not a document
    let bpb = r.bits_per_byte.unwrap();
    assert!((bpb - r.nll_sum / bytes / std::f64::consts::LN_2).abs() < 1e-12);
    let words = r.data.words.unwrap() as f64;
    assert!((r.word_perplexity.unwrap() - (r.nll_sum / words).exp()).abs() < 1e-9);
    assert!((r.byte_perplexity.unwrap() - (r.nll_sum / bytes).exp()).abs() < 1e-12);
}
