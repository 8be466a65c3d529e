//! KVM's own counters for a VM and its vCPUs (`KVM_GET_STATS_FD`, Linux 5.14+): the
//! exits, halts, page faults and TLB flushes that KVM handles in the kernel and kumo
//! never sees. Read once, when a vCPU or the VM ends; only the process that created
//! the VM may read them (others get `EIO`). One instant value, a vCPU's `blocking`,
//! is also read while it runs ([`InstantStat`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::{KVM_STATS_TYPE_CUMULATIVE, KVM_STATS_TYPE_INSTANT, KVM_STATS_TYPE_MASK, KVMIO};

/// `_IO(KVMIO, 0xce)`.
const KVM_GET_STATS_FD: libc::c_ulong = ((KVMIO as libc::c_ulong) << 8) | 0xce;
/// `struct kvm_stats_header` and `struct kvm_stats_desc` without its name.
const HEADER_BYTES: usize = 24;
const DESC_BYTES: usize = 16;
/// A file this large is not KVM's: refuse it rather than allocate for it.
const MAX_DESCS: usize = 4096;
const MAX_NAME: usize = 256;
const MAX_DATA: usize = 1 << 20;

/// One counter, by KVM's name (`exits`, `halt_exits`, `pf_taken`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub name: String,
    pub value: u64,
}

/// The counters of a VM that ended: its own and each vCPU's (index = vCPU). A list is
/// empty where this kernel has no statistics fd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvmStats {
    pub vm: Vec<Counter>,
    pub vcpus: Vec<Vec<Counter>>,
}

/// The cumulative single-value counters of a VM or vCPU fd, in KVM's order; histograms,
/// peaks and instant values are left out.
pub fn cumulative(fd: &impl AsRawFd) -> io::Result<Vec<Counter>> {
    parse(&stats_fd(fd)?)
}

/// One instant value of a VM or vCPU, read where it lies with one 8-byte `pread`.
///
/// The credit driver reads a vCPU's `blocking` (1 from the moment it halts in the
/// kernel until its thread runs again) at every run: a syscall that copies 8 bytes,
/// 0.5 µs here, where the thread's `/proc/<tid>/stat` formats 52 fields for 3.3-3.8 µs
/// (about 5 under load; docs/results/2026-11-29-driver-sensing.md).
#[derive(Debug)]
pub struct InstantStat {
    stats: File,
    at: u64,
}

impl InstantStat {
    /// The instant value `name` of `fd`; `None` where this kernel has no statistics fd
    /// or no such value.
    pub fn open(fd: &impl AsRawFd, name: &str) -> Option<InstantStat> {
        let stats = stats_fd(fd).ok()?;
        let at = Descriptors::read(&stats)
            .ok()?
            .find(KVM_STATS_TYPE_INSTANT, name)?;
        Some(InstantStat { stats, at })
    }

    pub fn read(&self) -> io::Result<u64> {
        let mut value = [0u8; 8];
        self.stats.read_exact_at(&mut value, self.at)?;
        Ok(u64::from_ne_bytes(value))
    }
}

fn stats_fd(fd: &impl AsRawFd) -> io::Result<File> {
    // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
    let raw: RawFd = unsafe { libc::ioctl(fd.as_raw_fd(), KVM_GET_STATS_FD as _, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is the fd KVM_GET_STATS_FD just returned: open, and owned by
    // nothing else, so the File may close it.
    Ok(unsafe { File::from_raw_fd(raw) })
}

/// A statistics file's descriptors (Documentation/virt/kvm/api.rst, "KVM_GET_STATS_FD").
struct Descriptors {
    bytes: Vec<u8>,
    size: usize,
    data_offset: u64,
}

/// One descriptor: its type flags, how many values, where they lie in the data block
/// and its name.
struct Descriptor<'a> {
    flags: u32,
    size: u16,
    offset: u32,
    name: &'a [u8],
}

impl Descriptors {
    fn read(stats: &impl FileExt) -> io::Result<Descriptors> {
        let mut header = [0u8; HEADER_BYTES];
        stats.read_exact_at(&mut header, 0)?;
        let name_size = word(&header, 4) as usize;
        let count = word(&header, 8) as usize;
        let desc_offset = u64::from(word(&header, 16));
        let data_offset = u64::from(word(&header, 20));
        if count > MAX_DESCS || name_size > MAX_NAME {
            return Err(bad("KVM statistics header out of range"));
        }
        let size = DESC_BYTES + name_size;
        let mut bytes = vec![0u8; size * count];
        stats.read_exact_at(&mut bytes, desc_offset)?;
        Ok(Descriptors {
            bytes,
            size,
            data_offset,
        })
    }

    fn iter(&self) -> impl Iterator<Item = Descriptor<'_>> {
        self.bytes.chunks_exact(self.size).map(|desc| {
            let name = &desc[DESC_BYTES..];
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            Descriptor {
                flags: word(desc, 0),
                size: u16::from_ne_bytes([desc[6], desc[7]]),
                offset: word(desc, 8),
                name: &name[..end],
            }
        })
    }

    /// The file offset of the single value `name` of type `kind`.
    fn find(&self, kind: u32, name: &str) -> Option<u64> {
        self.iter()
            .find(|d| {
                d.flags & KVM_STATS_TYPE_MASK == kind && d.size == 1 && d.name == name.as_bytes()
            })
            .map(|d| self.data_offset + u64::from(d.offset))
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads every cumulative single value.
fn parse(stats: &impl FileExt) -> io::Result<Vec<Counter>> {
    let descs = Descriptors::read(stats)?;
    // Every value in one read: the data block ends after the furthest descriptor's.
    let data_len = descs
        .iter()
        .map(|d| d.offset as usize + 8 * usize::from(d.size))
        .max()
        .unwrap_or(0);
    if data_len > MAX_DATA {
        return Err(bad("KVM statistics data out of range"));
    }
    let mut data = vec![0u8; data_len];
    stats.read_exact_at(&mut data, descs.data_offset)?;
    Ok(descs
        .iter()
        .filter(|d| d.flags & KVM_STATS_TYPE_MASK == KVM_STATS_TYPE_CUMULATIVE && d.size == 1)
        .map(|d| {
            let at = d.offset as usize;
            Counter {
                name: String::from_utf8_lossy(d.name).into_owned(),
                value: u64::from_ne_bytes(data[at..at + 8].try_into().expect("8 bytes")),
            }
        })
        .collect())
}

fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{KVM_STATS_TYPE_LOG_HIST, KVM_STATS_TYPE_PEAK};
    use std::io::Write;

    const NAME: usize = 48;

    /// A statistics file as KVM lays it out: header, id, descriptors, data.
    fn stats_file(descs: &[(u32, u16, &str, &[u64])]) -> File {
        let desc_offset = HEADER_BYTES + NAME;
        let data_offset = desc_offset + descs.len() * (DESC_BYTES + NAME);
        let mut bytes = Vec::new();
        for v in [0, NAME, descs.len(), HEADER_BYTES, desc_offset, data_offset] {
            bytes.extend_from_slice(&(v as u32).to_ne_bytes());
        }
        bytes.extend_from_slice(&[b'k'; NAME]);
        let mut data = Vec::new();
        for (flags, size, name, values) in descs {
            bytes.extend_from_slice(&flags.to_ne_bytes());
            bytes.extend_from_slice(&0i16.to_ne_bytes());
            bytes.extend_from_slice(&size.to_ne_bytes());
            bytes.extend_from_slice(&((data.len() * 8) as u32).to_ne_bytes());
            bytes.extend_from_slice(&0u32.to_ne_bytes());
            let mut padded = name.as_bytes().to_vec();
            padded.resize(NAME, 0);
            bytes.extend_from_slice(&padded);
            data.extend_from_slice(values);
        }
        for v in data {
            bytes.extend_from_slice(&v.to_ne_bytes());
        }
        let mut file = temp_file();
        file.write_all(&bytes).unwrap();
        file
    }

    fn temp_file() -> File {
        vmm_sys_util::tempfile::TempFile::new().unwrap().into_file()
    }

    #[test]
    fn reads_cumulative_counters_and_skips_the_rest() {
        let file = stats_file(&[
            (KVM_STATS_TYPE_CUMULATIVE, 1, "exits", &[8148]),
            (KVM_STATS_TYPE_PEAK, 1, "max_mmu_rmap_size", &[7]),
            (KVM_STATS_TYPE_LOG_HIST, 3, "halt_wait_hist", &[1, 2, 3]),
            (
                KVM_STATS_TYPE_CUMULATIVE | 0x20,
                1,
                "halt_wait_ns",
                &[9_596_675],
            ),
        ]);
        assert_eq!(
            parse(&file).unwrap(),
            vec![
                Counter {
                    name: "exits".into(),
                    value: 8148
                },
                Counter {
                    name: "halt_wait_ns".into(),
                    value: 9_596_675
                },
            ]
        );
    }

    #[test]
    fn an_instant_value_is_found_where_it_lies() {
        let file = stats_file(&[
            (KVM_STATS_TYPE_CUMULATIVE, 1, "exits", &[8148]),
            (KVM_STATS_TYPE_CUMULATIVE, 1, "blocking", &[5]),
            (KVM_STATS_TYPE_INSTANT, 1, "blocking", &[1]),
        ]);
        let descs = Descriptors::read(&file).unwrap();
        let at = descs.find(KVM_STATS_TYPE_INSTANT, "blocking").unwrap();
        let stat = InstantStat { stats: file, at };
        assert_eq!(stat.read().unwrap(), 1, "the instant one, not the counter");
        assert_eq!(descs.find(KVM_STATS_TYPE_INSTANT, "exits"), None);
        assert_eq!(descs.find(KVM_STATS_TYPE_INSTANT, "block"), None);
    }

    #[test]
    fn a_truncated_or_absurd_file_is_an_error() {
        let file = stats_file(&[(KVM_STATS_TYPE_CUMULATIVE, 1, "exits", &[1])]);
        file.set_len(HEADER_BYTES as u64 + 4).unwrap();
        assert!(parse(&file).is_err());
        let mut header = vec![0u8; HEADER_BYTES];
        header[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
        let mut file = temp_file();
        file.write_all(&header).unwrap();
        assert_eq!(parse(&file).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // A descriptor whose value lies 4 GiB away.
        let mut bytes = Vec::new();
        let file = stats_file(&[(KVM_STATS_TYPE_CUMULATIVE, 1, "exits", &[1])]);
        let mut reader = &file;
        std::io::Seek::rewind(&mut reader).unwrap();
        std::io::Read::read_to_end(&mut reader, &mut bytes).unwrap();
        let offset_at = HEADER_BYTES + NAME + 8;
        bytes[offset_at..offset_at + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let mut far = temp_file();
        far.write_all(&bytes).unwrap();
        assert_eq!(parse(&far).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_vcpu_counts_its_exits() {
        if !crate::testing::kvm_available() {
            return;
        }
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let counters = cumulative(&vcpu).unwrap();
        let blocking = InstantStat::open(&vcpu, "blocking").expect("blocking");
        assert_eq!(
            blocking.read().unwrap(),
            0,
            "a vCPU that never ran is not halted"
        );
        assert!(InstantStat::open(&vcpu, "no such value").is_none());
        assert!(counters.iter().any(|c| c.name == "exits"), "{counters:?}");
        assert!(
            cumulative(&vm)
                .unwrap()
                .iter()
                .any(|c| c.name == "remote_tlb_flush")
        );
    }
}
