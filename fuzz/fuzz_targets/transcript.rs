//! The transcript parser, then replay of what it read (tests/fuzz/props.rs `check_transcript`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/props.rs"]
mod props;

fuzz_target!(|data: &[u8]| {
    let _ = props::check_transcript(data);
});
