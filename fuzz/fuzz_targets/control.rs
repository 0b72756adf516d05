//! The control-protocol request parser (tests/fuzz/props.rs `check_control`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/props.rs"]
mod props;

fuzz_target!(|data: &[u8]| {
    let _ = props::check_control(data);
});
