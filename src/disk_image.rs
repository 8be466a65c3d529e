//! `kumo disk-image`: a raw disk image from which a firmware boots kumo's NPB guest:
//! a GPT with one EFI system partition (FAT16) holding the guest as a bzImage
//! (`crate::bzimage`) and a Boot Loader Specification entry naming it with its command
//! line. rust-hypervisor-firmware reads `loader/loader.conf`'s `default`, then the
//! entry's `linux` and `options` (see README: "Booting through the firmware").

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Cursor, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Args;
use std::path::PathBuf;

const SECTOR: u64 = 512;
const MIB: u64 = 1 << 20;
/// Room before the partition (protective MBR, GPT, 1 MiB alignment) and after it
/// (the backup GPT).
const GPT_MARGIN: u64 = MIB;
/// The smallest partition FAT16 takes with 2 KiB clusters (4085 clusters and more).
const MIN_PARTITION: u64 = 8 * MIB;
/// rust-hypervisor-firmware reads an entry file of at most 4 KiB and a command line
/// below the setup header's `cmdline_size` (4095): keep the options well inside both.
const MAX_OPTIONS: usize = 2048;

pub const GUEST_PATH: &str = "/kumo/npb-guest.bzImage";
const ENTRY_NAME: &str = "kumo-npb.conf";

/// The image's files: (path, contents).
fn files(options: &str, bzimage: Vec<u8>) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "loader/loader.conf",
            format!("default {ENTRY_NAME}\ntimeout 0\n").into_bytes(),
        ),
        (
            "loader/entries/kumo-npb.conf",
            format!("title kumo NPB guest\nlinux {GUEST_PATH}\noptions {options}\n").into_bytes(),
        ),
        (GUEST_PATH.trim_start_matches('/'), bzimage),
    ]
}

/// The entry's `options`: `npb=LIST` (if given) and the extra command line.
pub fn entry_options(npb: Option<&str>, cmdline: Option<&str>) -> Result<String> {
    let mut words = Vec::new();
    if let Some(list) = npb {
        let specs = kumo_vmm::guest::parse_specs(list)?;
        let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
        words.push(format!("npb={}", names.join(",")));
    }
    if let Some(extra) = cmdline {
        if let Some(c) = extra.chars().find(|c| !(' '..='~').contains(c)) {
            bail!("--cmdline: {c:?} cannot go in a boot entry (printable ASCII only)");
        }
        if !extra.trim().is_empty() {
            words.push(extra.trim().to_string());
        }
    }
    let options = words.join(" ");
    if options.len() > MAX_OPTIONS {
        bail!(
            "the command line is {} bytes, more than a boot entry takes here ({MAX_OPTIONS})",
            options.len()
        );
    }
    Ok(options)
}

/// A FAT16 file system of `size` bytes holding `files`.
fn fat_partition(size: u64, files: &[(&str, Vec<u8>)]) -> Result<Vec<u8>> {
    let mut volume = Cursor::new(vec![0u8; size as usize]);
    fatfs::format_volume(
        &mut volume,
        fatfs::FormatVolumeOptions::new()
            .fat_type(fatfs::FatType::Fat16)
            .volume_label(*b"KUMO-ESP   "),
    )
    .context("formatting the EFI system partition")?;
    volume.set_position(0);
    {
        let fs = fatfs::FileSystem::new(&mut volume, fatfs::FsOptions::new())
            .context("opening the new EFI system partition")?;
        for (path, contents) in files {
            let mut dir = fs.root_dir();
            let mut parts: Vec<&str> = path.split('/').collect();
            let name = parts.pop().unwrap_or_default();
            for part in parts {
                dir = dir.create_dir(part)?;
            }
            let mut file = dir.create_file(name)?;
            file.truncate()?;
            file.write_all(contents)
                .with_context(|| format!("writing {path} into the partition"))?;
        }
        fs.unmount().context("closing the EFI system partition")?;
    }
    Ok(volume.into_inner())
}

/// Writes the disk image to `out`: GPT, one EFI system partition, the guest and its
/// boot entry. Returns the image's size in bytes.
pub fn write_image(out: &Path, options: &str) -> Result<u64> {
    let bzimage = crate::bzimage::from_guest_elf(kumo_vmm::guest::EMBEDDED_GUEST)?;
    let partition_size = (bzimage.len() as u64 + MIB)
        .next_multiple_of(MIB)
        .max(MIN_PARTITION);
    let partition = fat_partition(partition_size, &files(options, bzimage))?;
    let total = GPT_MARGIN + partition_size + GPT_MARGIN;

    // Read and write: the GPT writer reads back what it wrote.
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(out)
        .with_context(|| format!("cannot create {}", out.display()))?;
    file.set_len(total)
        .with_context(|| format!("cannot size {}", out.display()))?;
    let gpt_error = |e: gpt::GptError| anyhow::anyhow!("writing the GPT: {e}");
    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .create_from_device(file, None)
        .map_err(gpt_error)?;
    disk.update_partitions(BTreeMap::new()).map_err(gpt_error)?;
    let id = disk
        .add_partition(
            "EFI system partition",
            partition_size,
            gpt::partition_types::EFI,
            0,
            Some(GPT_MARGIN / SECTOR),
        )
        .map_err(gpt_error)?;
    let first_lba = disk.partitions()[&id].first_lba;
    let mut file = disk.write().map_err(gpt_error)?;
    let sectors = u32::try_from(total / SECTOR - 1).unwrap_or(u32::MAX);
    gpt::mbr::ProtectiveMBR::with_lb_size(sectors)
        .overwrite_lba0(&mut file)
        .map_err(|e| anyhow::anyhow!("writing the protective MBR: {e}"))?;
    file.seek(SeekFrom::Start(first_lba * SECTOR))?;
    file.write_all(&partition)
        .with_context(|| format!("writing {}", out.display()))?;
    file.sync_all()?;
    Ok(total)
}

/// `kumo disk-image`.
pub fn run(args: &DiskImageArgs) -> Result<u8> {
    let options = entry_options(args.npb.as_deref(), args.cmdline.as_deref())?;
    let size = write_image(&args.out, &options)?;
    kumo_vmm::outln!(
        "{}: {} MiB, GPT + EFI system partition: {GUEST_PATH}, boot entry options {options:?}",
        args.out.display(),
        size / MIB
    );
    Ok(kumo_vmm::report::EXIT_OK)
}

#[derive(Args, Debug)]
pub struct DiskImageArgs {
    /// The image file to write (replaced if it exists).
    #[arg(long, value_name = "IMG")]
    pub out: PathBuf,

    /// Benchmarks the guest runs, comma-separated kernel.class items [default: every
    /// kernel, class S].
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// More of the guest's command line, after `npb=` (docs/guest-abi.md).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn options_name_the_benchmarks_and_refuse_what_an_entry_cannot_hold() {
        assert_eq!(entry_options(Some("ep.S"), None).unwrap(), "npb=ep.S");
        assert_eq!(
            entry_options(Some("ep.S, cg.W"), Some(" spin_us=0 ")).unwrap(),
            "npb=ep.S,cg.W spin_us=0"
        );
        assert_eq!(entry_options(None, None).unwrap(), "");
        assert!(entry_options(Some("xx.S"), None).is_err());
        assert!(entry_options(None, Some("a\nlinux /evil")).is_err());
        assert!(entry_options(None, Some(&"x".repeat(MAX_OPTIONS + 1))).is_err());
    }

    #[test]
    fn the_image_has_a_gpt_an_efi_partition_and_the_files_the_firmware_reads() {
        let path = std::env::temp_dir().join(format!("kumo-disk-image-{}.img", std::process::id()));
        write_image(&path, "npb=ep.S").unwrap();
        let disk = gpt::GptConfig::new().open(&path).unwrap();
        let parts: Vec<_> = disk.partitions().values().collect();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].part_type_guid, gpt::partition_types::EFI);
        let (first, last) = (parts[0].first_lba, parts[0].last_lba);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[510..512], &[0x55, 0xaa], "protective MBR");
        let volume = bytes[(first * SECTOR) as usize..((last + 1) * SECTOR) as usize].to_vec();
        let fs = fatfs::FileSystem::new(Cursor::new(volume), fatfs::FsOptions::new()).unwrap();
        assert_eq!(fs.fat_type(), fatfs::FatType::Fat16);
        let read = |path: &str| {
            let mut text = Vec::new();
            fs.root_dir()
                .open_file(path)
                .unwrap()
                .read_to_end(&mut text)
                .unwrap();
            text
        };
        let conf = String::from_utf8(read("loader/loader.conf")).unwrap();
        assert!(conf.starts_with("default kumo-npb.conf\n"), "{conf}");
        let entry = String::from_utf8(read("loader/entries/kumo-npb.conf")).unwrap();
        assert!(
            entry.contains(&format!("\nlinux {GUEST_PATH}\n")),
            "{entry}"
        );
        assert!(entry.contains("\noptions npb=ep.S\n"), "{entry}");
        let guest = read(GUEST_PATH.trim_start_matches('/'));
        assert_eq!(
            guest,
            crate::bzimage::from_guest_elf(kumo_vmm::guest::EMBEDDED_GUEST).unwrap()
        );
    }
}
