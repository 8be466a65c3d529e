//! Files kumo reads: checked for type and size before a byte is read, then read with a
//! bound. A FIFO, a device such as `/dev/zero` or a sparse multi-gigabyte file is refused
//! in one line at once instead of blocking or growing until memory runs out.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The largest configuration file (node or simulation file) kumo reads.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Opens the regular file at `path` for reading; anything else (a FIFO, a device, a
/// directory) is refused at once, never waited on. `what` names it in errors.
pub fn open_regular(what: &str, path: &Path) -> Result<(File, std::fs::Metadata)> {
    let context = || format!("cannot read {what} {}", path.display());
    // O_NONBLOCK: opening a FIFO with no writer would otherwise block before we can
    // look at what it is. It does not change reads of a regular file.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .with_context(context)?
    };
    let meta = file.metadata().with_context(context)?;
    if !meta.is_file() {
        bail!(
            "cannot read {what} {}: not a regular file ({})",
            path.display(),
            kind(&meta)
        );
    }
    Ok((file, meta))
}

/// Reads the regular file at `path`, at most `limit` bytes; `what` names it in errors
/// ("kernel", "module", "node file").
pub fn read_bounded(what: &str, path: &Path, limit: u64) -> Result<Vec<u8>> {
    let context = || format!("cannot read {what} {}", path.display());
    let (file, meta) = open_regular(what, path)?;
    if meta.len() > limit {
        bail!(
            "{what} {} is {} bytes; at most {limit} fit",
            path.display(),
            meta.len()
        );
    }
    read_at_most(file, limit)
        .with_context(context)?
        .ok_or_else(|| {
            // The file grew between the check and the read.
            anyhow::anyhow!(
                "{what} {} grew beyond {limit} bytes while being read",
                path.display()
            )
        })
}

/// Reads a UTF-8 configuration file of at most [`MAX_CONFIG_BYTES`].
pub fn read_config(what: &str, path: &Path) -> Result<String> {
    let bytes = read_bounded(what, path, MAX_CONFIG_BYTES)?;
    String::from_utf8(bytes).with_context(|| format!("{what} {} is not UTF-8", path.display()))
}

/// All of `file` if it holds at most `limit` bytes, `None` if it holds more.
fn read_at_most(file: File, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kumo-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn a_small_file_is_read_whole() {
        let path = scratch("small");
        std::fs::write(&path, b"hello").unwrap();
        assert_eq!(read_bounded("file", &path, 5).unwrap(), b"hello");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_by_its_size() {
        let path = scratch("large");
        std::fs::write(&path, b"hello!").unwrap();
        let err = read_bounded("module", &path, 5).unwrap_err().to_string();
        assert!(err.contains("is 6 bytes; at most 5 fit"), "{err}");
    }

    #[test]
    fn devices_and_fifos_are_refused_without_reading() {
        let err = read_bounded("module", Path::new("/dev/zero"), 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not a regular file (a character device)"),
            "{err}"
        );
        let fifo = scratch("fifo");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; the return value is checked.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_bounded("kernel", &fifo, 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a FIFO"), "{err}");
    }

    #[test]
    fn a_growing_file_is_cut_at_the_limit() {
        let path = scratch("growing");
        std::fs::write(&path, b"0123456789").unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(read_at_most(file, 9).unwrap(), None);
        let file = File::open(&path).unwrap();
        assert_eq!(read_at_most(file, 10).unwrap().unwrap().len(), 10);
    }
}
