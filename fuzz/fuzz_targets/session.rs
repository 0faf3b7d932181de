#![no_main]
// See kvlab_fuzz::session for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvlab_fuzz::session::check(data));
