//! `ctl` lines, whole and cut across two writes (tests/fuzz/props.rs `check_ctl`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/props.rs"]
mod props;

fuzz_target!(|data: &[u8]| {
    props::check_ctl(data);
});
