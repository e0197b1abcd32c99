//! Machine-readable comparison summary.

use super::compare::{compare, NamedRun};

pub fn render(runs: &[NamedRun]) -> String {
    let rows = compare(runs);
    serde_json::to_string_pretty(&serde_json::json!({ "runs": rows })).expect("rows serialize")
        + "\n"
}
