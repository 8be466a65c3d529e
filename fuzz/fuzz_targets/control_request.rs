//! The control API's request parser (vmm/src/api/routes.rs): a request line matched to
//! a route (`resolve`: method, path, query), then its body parsed into the call the
//! server makes (`parse`: the spec's request types, unknown fields refused). Half the
//! inputs aim at a real route with fuzzed bytes as its body; the rest are a fuzzed
//! request line ("METHOD PATH?QUERY") and body. Neither may panic, whatever arrives.
#![no_main]

use kumo_vmm::api::routes::{self, ROUTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector & 1 == 0 {
        let (method, template) = ROUTES[usize::from(selector / 2) % ROUTES.len()];
        let path = template.replace("{name}", "dom0").replace("{id}", "1");
        if let Ok(matched) = routes::resolve(method, &path, None) {
            let _ = routes::parse(&matched, rest);
        }
        return;
    }
    let text = String::from_utf8_lossy(rest);
    let (line, body) = text.split_once('\n').unwrap_or((&text, ""));
    let (method, target) = line.split_once(' ').unwrap_or((line, ""));
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    if let Ok(matched) = routes::resolve(method, path, query) {
        let _ = routes::parse(&matched, body.as_bytes());
    }
});
