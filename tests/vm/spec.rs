//! `kumo --print-spec` (the VmSpec the flags make, printed without booting) and
//! `kumo --spec FILE` (a VmSpec booted from a file).

use crate::common;

use common::*;

/// The spec `kumo --print-spec` prints for `flags`, parsed.
fn printed_spec(flags: &[&str]) -> serde_json::Value {
    let mut args = vec!["--print-spec"];
    args.extend_from_slice(flags);
    let out = kumo(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "kumo {args:?}: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("kumo {args:?} printed no JSON ({e}): {}", text(&out.stdout)))
}

#[test]
fn print_spec_shows_the_flags_as_a_vm_spec() {
    let spec = printed_spec(&["--vcpus", "3", "--npb", "ep.S,cg.W", "--memory", "300"]);
    assert_eq!(spec["machine"]["vcpus"], 3, "{spec}");
    assert_eq!(spec["machine"]["memory_mib"], 300, "{spec}");
    assert_eq!(spec["guest"]["kind"], "npb", "{spec}");
    assert_eq!(
        spec["guest"]["benchmarks"],
        serde_json::json!(["ep.S", "cg.W"]),
        "{spec}"
    );
    let kernel = printed_spec(&["--kernel", "/k.elf", "--cmdline", "x=1"]);
    assert_eq!(kernel["guest"]["kind"], "kernel", "{kernel}");
    assert_eq!(kernel["guest"]["path"], "/k.elf", "{kernel}");
    assert_eq!(kernel["guest"]["cmdline"], "x=1", "{kernel}");
}

#[test]
fn flags_beside_spec_are_refused() {
    let path = scratch("spec-with-flags.json");
    std::fs::write(&path, r#"{"machine":{"vcpus":1},"guest":{"kind":"npb"}}"#).unwrap();
    assert_refused(
        &["--spec", path.to_str().unwrap(), "--vcpus", "3"],
        "--vcpus does not go with --spec",
    );
}

#[test]
fn a_misspelt_spec_file_is_refused_by_name() {
    let path = scratch("spec-typo.json");
    std::fs::write(
        &path,
        r#"{"machine":{"vcpus":1,"memroy_mib":64},"guest":{"kind":"npb"}}"#,
    )
    .unwrap();
    assert_refused(
        &["--spec", path.to_str().unwrap()],
        "unknown field `memroy_mib`",
    );
}

/// The spec `--print-spec` prints boots, from a file, to the run the flags make.
#[test]
fn ep_s_boots_from_a_printed_spec_file() {
    if kvm_available() {
        let spec = printed_spec(&["--vcpus", "2", "--npb", "ep.S"]);
        let path = scratch("ep-s.json");
        std::fs::write(&path, spec.to_string()).unwrap();
        let out = kumo(&["--spec", path.to_str().unwrap(), "--json"]);
        assert_ep_verified(&out, "S");
    }
}
