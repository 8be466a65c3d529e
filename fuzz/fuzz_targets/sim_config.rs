//! Simulation file parsing and validation (lab/src/sim/config.rs): any text given to
//! `kumo sim` must give a simulation or a one-line error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = kumo_lab::sim::config::parse(text) {
        let message = e.to_string();
        assert!(!message.contains('\n'), "a multi-line error: {message}");
    }
});
