//! The YAML configuration parser (with `${VAR}` expansion and `--set` overrides) on arbitrary
//! text: a configuration or an error naming the key, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (yaml, set) = text.split_once("\n--set ").unwrap_or((text, ""));
    let sets: Vec<String> = if set.is_empty() {
        Vec::new()
    } else {
        vec![set.to_string()]
    };
    let env = |v: &str| (v == "NUM_NODES").then(|| "2".to_string());
    let _ = ppl::cli::config::Config::parse(yaml, "fuzz.yaml", &sets, &env);
});
