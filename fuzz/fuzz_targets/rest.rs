#![no_main]
// See kvlab_fuzz::rest for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvlab_fuzz::rest::check(data));
