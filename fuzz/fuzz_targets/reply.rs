#![no_main]
// See kvlab_fuzz::reply for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvlab_fuzz::reply::check(data));
