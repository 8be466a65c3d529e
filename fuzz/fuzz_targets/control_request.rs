//! The control request parser (vmm/src/spec/control.rs): a request body parsed into
//! the spec's `Request` (whatever carries it, a JSON line or an HTTP body), then, for
//! scheduler changes, checked and applied to the current parameters as the control
//! server does (vmm/src/spec/sched.rs). A request that parses encodes back to itself.
#![no_main]

use kumo_vmm::spec::control::{Request, SchedUpdate};
use kumo_vmm::spec::sched;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<Request>(data) else {
        return;
    };
    let encoded = serde_json::to_string(&request).expect("a request encodes");
    let again: Request = serde_json::from_str(&encoded).expect("its encoding parses");
    assert_eq!(again, request);
    if let Request::SchedCredit {
        tslice_ms,
        tick_ms,
        ratelimit_us,
        accounting,
        directed_yield,
    } = request
    {
        let update = SchedUpdate {
            tslice_ms,
            tick_ms,
            ratelimit_us,
            accounting,
            directed_yield,
        };
        if let Ok(params) = sched::from_update(update) {
            let _ = sched::view(params);
        }
    }
});
