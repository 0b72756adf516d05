//! The FUSE request decoder (src/transport/decode.rs), fed arbitrary bytes both as a
//! `/dev/fuse` read and as a ring entry (`fuse_uring_req_header`, then the payload), with
//! both protocol layouts SETXATTR can have: it must never panic, and what it accepts must
//! be consistent (tests/fuzz/props.rs `check_fuse_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/props.rs"]
mod props;

fuzz_target!(|data: &[u8]| {
    props::check_fuse_decode(data);
});
