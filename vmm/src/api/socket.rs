//! The API socket's path: bound private from the start, and what may be replaced.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// Binds a socket that only its owner can reach from the moment it appears at
/// `path`: it is bound under a temporary name beside `path`, restricted to
/// mode 0600 and then renamed into place, so no one can connect (and no one
/// watching for `path` can see it) while it is still open to all.
pub fn bind_private(path: &Path) -> Result<UnixListener> {
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a socket path", path.display()))?;
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(name);
    hidden.push(format!(".{}.tmp", std::process::id()));
    let staging = path.with_file_name(hidden);
    remove_stale_socket(&staging)?;
    let listener = UnixListener::bind(&staging)
        .with_context(|| format!("cannot create API socket {}", path.display()))?;
    let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {} to its owner", path.display()))
        .and_then(|()| {
            std::fs::rename(&staging, path)
                .with_context(|| format!("cannot create API socket {}", path.display()))
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&staging);
        return Err(e);
    }
    Ok(listener)
}

/// Removes what is at `path` only if kumo can prove it a stale socket (a crashed
/// kumo's): a socket whose connections are refused. Nothing there is fine; anything
/// else (a regular file, a directory, a symbolic link, a socket someone listens on or
/// kumo may not reach) is refused and left alone.
pub fn remove_stale_socket(path: &Path) -> Result<()> {
    let shown = path.display();
    let meta = match path.symlink_metadata() {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("cannot inspect {shown}: {e}"),
    };
    if meta.file_type().is_symlink() {
        bail!("{shown} is a symbolic link: not following or removing it");
    }
    if !meta.file_type().is_socket() {
        bail!("{shown} exists and is not a socket: not removing it");
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!("{shown} is in use by another kumo"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .map_err(|e| anyhow::anyhow!("cannot remove stale socket {shown}: {e}")),
        Err(e) => bail!("{shown} is a socket kumo cannot tell is stale ({e}): not removing it"),
    }
}
