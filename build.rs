//! Names the commit the `kumo` binary is built from (`KUMO_COMMIT`), so that a
//! benchmark record says which code it measured even when an old binary runs in a
//! newer checkout. Outside a git checkout (a source tarball) the name is absent.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // HEAD moves on a checkout; the branch it names moves on a commit (in a worktree
    // both live under paths `--git-path` resolves).
    // Only files that exist: cargo reruns the script on every build for a missing one.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for path in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(p) = git(&["rev-parse", "--git-path", path])
            && std::path::Path::new(&p).exists()
        {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(rev) = git(&["rev-parse", "HEAD"]) {
        println!("cargo:rustc-env=KUMO_COMMIT={rev}");
    }
}
