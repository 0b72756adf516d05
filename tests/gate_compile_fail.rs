//! The gate cannot be skipped: code outside src/fs/gate.rs that tries to change SRC without
//! a permit does not compile. Each file in tests/compile-fail/ is one such attempt, with the
//! compiler's refusal next to it (`.stderr`; regenerate with `TRYBUILD=overwrite` after a
//! toolchain update, and read the diff: each must still fail for the reason its comment
//! gives). The raw syscalls themselves are refused by clippy.toml (`cargo clippy`).
#[test]
fn a_mutation_without_its_permit_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile-fail/*.rs");
}
