//! Bytes as one policy file: the loader returns a set or located errors, never panics.
#![no_main]

use std::path::PathBuf;

use edgelimit::policy::{LoadOptions, PolicySet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Files are read as UTF-8 text; anything else is a read error before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = PathBuf::from("fuzz.yaml");
    match PolicySet::from_sources(vec![(file, text.to_owned())], &LoadOptions::default()) {
        Ok(_) => {}
        Err(errors) => {
            // Every error names the file it is about.
            assert!(!errors.errors().is_empty());
            for e in errors.errors() {
                assert!(e.to_string().contains("fuzz.yaml"), "unlocated error: {e}");
            }
        }
    }
});
