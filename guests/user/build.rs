//! Links the runtime as a freestanding static image at its fixed load address: built
//! for x86_64-unknown-linux-gnu only to get hardware floating point, it uses nothing of
//! Linux or libc.

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rerun-if-changed=user.ld");
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wl,--build-id=none",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{manifest}/user.ld");
}
