//! The YAML configuration on alias-heavy text ("billion laughs", deep nesting): the bounds
//! check either refuses it, or the document it lets through really is small — loading it
//! gives at most `MAX_NODES` values, nested at most `MAX_DEPTH` deep. Then the whole parser
//! (`Config::parse`) runs on it: a configuration or an error, never a panic or a blow-up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ppl::cli::yaml_bounds::{check, MAX_DEPTH, MAX_NODES};
use yaml_rust2::{Yaml, YamlLoader};

/// Values in `y` (collections count one plus their contents, keys included), stopping early
/// once past `budget`; and the depth.
fn size(y: &Yaml, depth: usize, budget: &mut u64, max_depth: &mut usize) {
    *max_depth = (*max_depth).max(depth);
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    match y {
        Yaml::Array(v) => v.iter().for_each(|c| size(c, depth + 1, budget, max_depth)),
        Yaml::Hash(h) => h.iter().for_each(|(k, v)| {
            size(k, depth + 1, budget, max_depth);
            size(v, depth + 1, budget, max_depth);
        }),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if check(text).is_ok() {
        if let Ok(docs) = YamlLoader::load_from_str(text) {
            let mut budget = MAX_NODES + 1;
            let mut depth = 0;
            for d in &docs {
                size(d, 0, &mut budget, &mut depth);
            }
            assert!(budget > 0, "the bounds check let through more than {MAX_NODES} values");
            assert!(depth <= MAX_DEPTH + 1, "nested {depth} deep");
        }
    }
    let env = |v: &str| (v == "NUM_NODES").then(|| "2".to_string());
    let _ = ppl::cli::config::Config::parse(text, "fuzz.yaml", &[], &env);
});
