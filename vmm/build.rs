//! Builds kumo's own guest (guests/) into one PVH ELF and tells the crate where it is
//! (`KUMO_GUEST_ELF`, for `include_bytes!`).
//!
//! Two nested cargo builds, in order: the ring-3 runtime (guests/user) for
//! x86_64-unknown-linux-gnu (it needs hardware floating point), then the ring-0
//! supervisor (guests/kernel) for x86_64-unknown-none, which embeds the runtime. They use
//! a target directory under OUT_DIR (the outer one is locked by the outer cargo) and an
//! environment cleaned of the outer build's settings (flags, wrappers, target, profile).

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

const USER_TARGET: &str = "x86_64-unknown-linux-gnu";
const KERNEL_TARGET: &str = "x86_64-unknown-none";

fn main() {
    // This crate is vmm/ in the workspace; the guest's sources are beside it.
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("vmm/ has a parent");
    let guests = root.join("guests");
    let target_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("guest");
    for input in [
        "../guests/abi",
        "../guests/kernel",
        "../guests/user",
        "../guests/npb",
        "../guests/.cargo",
        "../guests/Cargo.toml",
        "../guests/Cargo.lock",
        "../rust-toolchain.toml",
    ] {
        println!("cargo:rerun-if-changed={input}");
    }

    ensure_target_installed(KERNEL_TARGET);
    let user_elf = target_dir.join(USER_TARGET).join("release/kumo-user");
    nested_build(&guests, &target_dir, "kumo-user", USER_TARGET, &[]);
    nested_build(
        &guests,
        &target_dir,
        "kumo-kernel",
        KERNEL_TARGET,
        &[("KUMO_USER_ELF", user_elf.as_os_str())],
    );
    let guest_elf = target_dir.join(KERNEL_TARGET).join("release/kumo-kernel");
    println!("cargo:rustc-env=KUMO_GUEST_ELF={}", guest_elf.display());
}

fn nested_build(
    guests: &Path,
    target_dir: &Path,
    package: &str,
    target: &str,
    env: &[(&str, &OsStr)],
) {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(guests)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            package,
            "--target",
            target,
            "--target-dir",
        ])
        .arg(target_dir);
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if is_outer_build_setting(key) {
            command.env_remove(key);
        }
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the guest's {package}: {e}"));
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stdout));
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        panic!("building the guest's {package} ({target}) failed; its output is above");
    }
}

/// The guest supervisor needs the bare-metal target's `core`. rust-toolchain.toml asks
/// rustup for it, but a toolchain installed by hand (or with rustup's auto-install off)
/// may lack it: add it rather than fail with "can't find crate for `core`".
fn ensure_target_installed(target: &str) {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let Some(sysroot) = sysroot else { return };
    if sysroot.join("lib/rustlib").join(target).exists() {
        return;
    }
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", target]);
    if let Some(toolchain) = env::var_os("RUSTUP_TOOLCHAIN") {
        rustup.arg("--toolchain").arg(toolchain);
    }
    match rustup.status() {
        Ok(status) if status.success() => {}
        _ => panic!(
            "the guest needs the Rust target {target}: run `rustup target add {target}` \
             (rust-toolchain.toml lists it)"
        ),
    }
}

/// Variables the outer cargo sets or honours that must not leak into the guest build.
/// `RUSTUP_TOOLCHAIN` (same compiler), `CARGO_HOME` (same registry cache) and
/// `CARGO_MAKEFLAGS` (the outer cargo's jobserver: the guest's jobs share its `-j`
/// instead of starting as many again on the same cores) are kept.
fn is_outer_build_setting(key: &str) -> bool {
    (key.starts_with("CARGO_") && !matches!(key, "CARGO_HOME" | "CARGO_MAKEFLAGS"))
        || key.starts_with("RUSTC")
        || key.starts_with("RUSTDOC")
        || matches!(
            key,
            "RUSTFLAGS"
                | "TARGET"
                | "HOST"
                | "OUT_DIR"
                | "OPT_LEVEL"
                | "PROFILE"
                | "DEBUG"
                | "NUM_JOBS"
        )
}
