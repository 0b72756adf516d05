//! The store journal parser (tests/fuzz/props.rs `check_journal`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/props.rs"]
mod props;

fuzz_target!(|data: &[u8]| {
    props::check_journal(data);
});
