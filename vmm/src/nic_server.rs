//! `kumo nic-server`: the NIC hardware as another process. Each port is a virtio-net
//! PCI function (kumo's own device model and transport, `devices::virtio`) served over
//! vfio-user on its own UNIX socket, `DIR/port-K.sock`; the ports share one Ethernet
//! inside the server (the switch of `hv::net`, here the physical network between
//! ports, not a domain 0).
//!
//! A client (kumo with `--passthrough vfio-user:PATH`) hands its guest memory over by
//! fd (`DMA_MAP`); the device model maps it and does DMA straight into it. The queue
//! doorbells are eventfds the server creates and hands out (`GET_REGION_IO_FDS`), which
//! the client's KVM signals on a guest write; the MSI-X vectors are eventfds the client
//! hands in (`SET_IRQS`), which the server writes and the client's KVM injects. So the
//! data path is: guest doorbell -> KVM -> this server's switch thread -> copy between
//! the two guests' buffers -> eventfd -> KVM -> the other guest; no client thread.
//!
//! Threads: one switch thread for all ports (the NIC's "hardware", not a credit
//! domain: it runs wherever Linux puts it, at nice -10 when allowed, and uses the CPU
//! the frames need), and one control thread per port serving its socket (configuration
//! accesses only).

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use clap::Args;
use devices::interrupt::{InterruptSourceGroup, MsiMessage};
use devices::net::switch::SwitchConfig;
use devices::pci::msix::CONTROL_ENABLE;
use devices::vfio_user::proto::{self, DeviceInfo, IoFd, IrqInfo, RegionInfo, Request, vfio};
use devices::vfio_user::socket::{self, Message, SocketError};
use devices::virtio::VirtioPciDevice;
use devices::virtio::net::{NetConfig, VirtioNet};
use devices::virtio::transport::{self, TransportAction};
use hv::net::{Network, ServedPort, WorkerStats};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

/// Queue size of the served NICs (as kumo's emulated NIC).
const QUEUE_SIZE: u16 = 256;
/// Queues of a port (one RX/TX pair) and its MSI-X vectors (config + one per queue).
const QUEUES: u16 = 2;
const VECTORS: u32 = QUEUES as u32 + 1;
/// Most DMA regions a client may map.
const MAX_DMA_REGIONS: usize = 64;
/// Bytes of configuration space served (the rest of ECAM reads zero at the client).
const CONFIG_BYTES: u64 = 256;

/// The socket of port `port` in `dir`.
pub fn port_socket(dir: &Path, port: u32) -> PathBuf {
    dir.join(format!("port-{port}.sock"))
}

/// `kumo nic-server`: serves until killed.
pub fn run(args: &NicServerArgs) -> Result<u8> {
    if !(1..=crate::spec::job::MAX_VMS).contains(&args.ports) {
        bail!(
            "--ports must be between 1 and {}, not {}",
            crate::spec::job::MAX_VMS,
            args.ports
        );
    }
    if !args.dir.is_dir() {
        bail!("{}: not a directory", args.dir.display());
    }
    if args.poll_us > 1_000_000 {
        bail!("--poll-us {} is above 1000000 (one second)", args.poll_us);
    }
    if !args.cpus.is_empty() {
        // Before any thread exists: every thread of the server inherits it.
        hv::placement::confine_thread(0, &args.cpus)
            .with_context(|| format!("--cpus {:?}", args.cpus))?;
    }
    let network = Arc::new(Network::new(SwitchConfig::default())?);
    let mut listeners = Vec::new();
    for k in 0..args.ports {
        let mac = crate::spec::job::mac(args.first_rank + k);
        let served = network.add_served_port(QUEUES, mac)?;
        let path = port_socket(&args.dir, k);
        let listener =
            listen_at(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
        crate::signals::track_socket(path.clone());
        listeners.push((listener, served, mac, path));
    }
    let _running = network.start_polling(None, std::time::Duration::from_micros(args.poll_us))?;
    eprintln!(
        "kumo nic-server: {} port(s) at {}/port-K.sock",
        args.ports,
        args.dir.display()
    );
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|(listener, served, mac, path)| {
            let network = network.clone();
            std::thread::Builder::new()
                .name(format!("nic-port{}", served.port))
                .spawn(move || serve_port(&listener, &served, mac, &network, &path))
        })
        .collect::<Result<_, _>>()?;
    for thread in threads {
        let _ = thread.join();
    }
    Ok(crate::report::EXIT_OK)
}

/// Listens on `path`, which appears only once it accepts connections: bind(2) makes
/// the path before listen(2), and a client that saw it in between was refused. So the
/// socket is bound under a name of this process's own and renamed into place.
fn listen_at(path: &Path) -> Result<UnixListener> {
    if path.symlink_metadata().is_ok() {
        bail!("{} already exists", path.display());
    }
    let mut staging = path.as_os_str().to_owned();
    staging.push(format!(".{}", std::process::id()));
    let staging = PathBuf::from(staging);
    let listener = UnixListener::bind(&staging)?;
    if let Err(e) = std::fs::rename(&staging, path) {
        let _ = std::fs::remove_file(&staging);
        return Err(e.into());
    }
    Ok(listener)
}

/// Serves one client after another on `listener`.
fn serve_port(
    listener: &UnixListener,
    served: &ServedPort,
    mac: [u8; 6],
    network: &Network,
    path: &Path,
) {
    hv::seccomp::apply_or_exit(hv::seccomp::ThreadKind::NicServer);
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("kumo nic-server: {}: accept: {e}", path.display());
                return;
            }
        };
        let mut session = Session {
            served,
            mac,
            network,
            dma: Vec::new(),
            device: None,
            irqs: Arc::new(Irqs::default()),
        };
        match session.serve(&stream) {
            Ok(()) | Err(SocketError::Closed) => {}
            Err(e) => eprintln!(
                "kumo nic-server: {}: {e}; dropping the client",
                path.display()
            ),
        }
        session.detach();
    }
}

/// The eventfds a client gave for the MSI-X vectors.
#[derive(Default)]
struct Irqs(Mutex<Vec<Option<File>>>);

impl InterruptSourceGroup for Irqs {
    fn trigger(&self, vector: u16) {
        let fds = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(fd)) = fds.get(usize::from(vector)) {
            // An eventfd write of 1; a full counter (a client that never reads) only
            // loses the interrupt.
            let one = 1u64.to_ne_bytes();
            let _ = std::io::Write::write(&mut &*fd, &one);
        }
    }
    // The client's table decides where vectors go; the server's is always open.
    fn update(&self, _vector: u16, _route: Option<MsiMessage>) {}
}

/// A DMA region the client mapped.
struct Dma {
    address: u64,
    size: u64,
    file: File,
    offset: u64,
}

struct Device {
    transport: Arc<VirtioPciDevice>,
}

/// One client's connection to a port.
struct Session<'a> {
    served: &'a ServedPort,
    mac: [u8; 6],
    network: &'a Network,
    dma: Vec<Dma>,
    device: Option<Device>,
    irqs: Arc<Irqs>,
}

/// A refusal: the errno the client gets.
type Refusal = u32;

impl Session<'_> {
    fn serve(&mut self, stream: &UnixStream) -> Result<(), SocketError> {
        loop {
            let Message { header, body, fds } = socket::receive(stream)?;
            if header.is_reply() {
                return Err(SocketError::Proto(proto::ProtoError::Invalid {
                    command: header.command,
                    why: "the client sent a reply",
                }));
            }
            let (bytes, out_fds) = match Request::parse(header.command, &body) {
                Ok(request) => match self.handle(request, fds) {
                    Ok((body, out)) => (proto::encode_reply(header.id, header.command, &body), out),
                    Err(errno) => (
                        proto::encode_error(header.id, header.command, errno),
                        vec![],
                    ),
                },
                Err(e) => {
                    tracing::debug!("nic-server: refusing a message: {e}");
                    (
                        proto::encode_error(header.id, header.command, libc::EINVAL as u32),
                        vec![],
                    )
                }
            };
            if header.flags & proto::FLAG_NO_REPLY == 0 {
                socket::send(stream, &bytes, &out_fds)?;
            }
        }
    }

    /// Answers one request: the reply's body and the descriptors to send with it (the
    /// port's own, which outlive the reply).
    fn handle(
        &mut self,
        request: Request,
        fds: Vec<File>,
    ) -> Result<(Vec<u8>, Vec<RawFd>), Refusal> {
        let inval = libc::EINVAL as u32;
        let body = match request {
            Request::Version { major, .. } => {
                if major != proto::VERSION_MAJOR {
                    return Err(libc::ENOTSUP as u32);
                }
                let caps = format!(
                    "{{\"capabilities\":{{\"max_msg_fds\":{},\"max_data_xfer_size\":{}}}}}",
                    proto::MAX_FDS,
                    proto::MAX_DATA
                );
                let mut body = proto::VERSION_MAJOR.to_le_bytes().to_vec();
                body.extend_from_slice(&proto::VERSION_MINOR.to_le_bytes());
                body.extend_from_slice(caps.as_bytes());
                body.push(0);
                body
            }
            Request::DmaMap {
                offset,
                address,
                size,
                ..
            } => {
                self.map(fds, offset, address, size)?;
                Vec::new()
            }
            // Memory stays mapped while the device model lives (it may be mid-DMA).
            Request::DmaUnmap { .. } => return Err(libc::EBUSY as u32),
            Request::DeviceGetInfo => DeviceInfo {
                flags: vfio::DEVICE_FLAGS_PCI | vfio::DEVICE_FLAGS_RESET,
                regions: vfio::PCI_NUM_REGIONS,
                irqs: vfio::PCI_NUM_IRQS,
            }
            .encode(),
            Request::GetRegionInfo { index } => {
                let size = match index {
                    vfio::PCI_BAR0_REGION_INDEX => transport::BAR_SIZE,
                    vfio::PCI_CONFIG_REGION_INDEX => CONFIG_BYTES,
                    i if i < vfio::PCI_NUM_REGIONS => 0,
                    _ => return Err(inval),
                };
                let rw = vfio::REGION_INFO_FLAG_READ | vfio::REGION_INFO_FLAG_WRITE;
                RegionInfo {
                    flags: if size > 0 { rw } else { 0 },
                    index,
                    size,
                    offset: 0,
                }
                .encode()
            }
            Request::GetRegionIoFds { index } => {
                if index >= vfio::PCI_NUM_REGIONS {
                    return Err(inval);
                }
                if index != vfio::PCI_BAR0_REGION_INDEX {
                    return Ok((proto::encode_io_fds(index, &[]), Vec::new()));
                }
                let entries: Vec<IoFd> = (0..QUEUES)
                    .map(|q| IoFd {
                        offset: transport::NOTIFY_OFFSET
                            + u64::from(transport::NOTIFY_OFF_MULTIPLIER) * u64::from(q),
                        size: u64::from(transport::NOTIFY_OFF_MULTIPLIER),
                        fd_index: u32::from(q),
                        kind: vfio::IO_FD_TYPE_EVENTFD,
                    })
                    .collect();
                let fds = self
                    .served
                    .doorbells
                    .iter()
                    .map(|fd| fd.as_raw_fd())
                    .collect();
                return Ok((proto::encode_io_fds(index, &entries), fds));
            }
            Request::GetIrqInfo { index } => {
                if index >= vfio::PCI_NUM_IRQS {
                    return Err(inval);
                }
                let msix = index == vfio::PCI_MSIX_IRQ_INDEX;
                IrqInfo {
                    flags: if msix {
                        vfio::IRQ_INFO_EVENTFD | vfio::IRQ_INFO_NORESIZE
                    } else {
                        0
                    },
                    index,
                    count: if msix { VECTORS } else { 0 },
                }
                .encode()
            }
            Request::SetIrqs {
                flags,
                index,
                start,
                count,
            } => {
                self.set_irqs(flags, index, start, count, fds)?;
                Vec::new()
            }
            Request::RegionRead {
                region,
                offset,
                count,
            } => {
                let mut data = vec![0; count as usize];
                self.access(region, offset, count)?;
                let device = self.device()?;
                match region {
                    vfio::PCI_BAR0_REGION_INDEX => device.transport.read_bar(0, offset, &mut data),
                    _ => device.transport.read_config(offset as usize, &mut data),
                }
                proto::encode_region_read(region, offset, &data)
            }
            Request::RegionWrite {
                region,
                offset,
                data,
            } => {
                self.access(region, offset, data.len() as u32)?;
                let device = self.device()?;
                let action = match region {
                    vfio::PCI_BAR0_REGION_INDEX => device.transport.write_bar(0, offset, &data),
                    _ => device.transport.write_config(offset as usize, &data),
                };
                if action == TransportAction::Activated {
                    eprintln!("kumo nic-server: port {}: driver up", self.served.port);
                }
                if action != TransportAction::None {
                    self.served.actions.act(action);
                }
                proto::encode_region_write(region, offset, data.len() as u32)
            }
            Request::DeviceReset => {
                if let Some(device) = &self.device {
                    let action = device.transport.write_bar(0, 0x14, &[0]);
                    if action != TransportAction::None {
                        self.served.actions.act(action);
                    }
                }
                Vec::new()
            }
        };
        Ok((body, Vec::new()))
    }

    /// Checks a region access: a served region, inside it, 1 to 8 bytes for the BAR.
    fn access(&self, region: u32, offset: u64, count: u32) -> Result<(), Refusal> {
        let size = match region {
            vfio::PCI_BAR0_REGION_INDEX if (1..=8).contains(&count) => transport::BAR_SIZE,
            vfio::PCI_CONFIG_REGION_INDEX => CONFIG_BYTES,
            _ => return Err(libc::EINVAL as u32),
        };
        match offset.checked_add(u64::from(count)) {
            Some(end) if end <= size => Ok(()),
            _ => Err(libc::EINVAL as u32),
        }
    }

    fn map(&mut self, fds: Vec<File>, offset: u64, address: u64, size: u64) -> Result<(), Refusal> {
        let inval = libc::EINVAL as u32;
        if self.device.is_some() {
            return Err(libc::EBUSY as u32); // the model's memory map is fixed once built
        }
        let [file] = <[File; 1]>::try_from(fds).map_err(|_| inval)?;
        let page = 4096;
        let end = address.checked_add(size).ok_or(inval)?;
        if size == 0
            || [address, size, offset]
                .iter()
                .any(|v| !v.is_multiple_of(page))
        {
            return Err(inval);
        }
        if offset.checked_add(size).is_none() || usize::try_from(size).is_err() {
            return Err(inval);
        }
        // A file the client could shrink after this check would turn the server's
        // next DMA into a SIGBUS that ends every client's NIC: only a memfd sealed
        // against shrinking keeps the size checked here.
        if !sealed_against_shrinking(&file) {
            return Err(libc::EPERM as u32);
        }
        let file_len = file.metadata().map_err(|_| inval)?.len();
        if offset + size > file_len {
            return Err(inval);
        }
        if self.dma.len() >= MAX_DMA_REGIONS
            || self
                .dma
                .iter()
                .any(|d| address < d.address + d.size && d.address < end)
        {
            return Err(inval);
        }
        self.dma.push(Dma {
            address,
            size,
            file,
            offset,
        });
        Ok(())
    }

    fn set_irqs(
        &mut self,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), Refusal> {
        let inval = libc::EINVAL as u32;
        if index != vfio::PCI_MSIX_IRQ_INDEX || flags & vfio::IRQ_SET_ACTION_TRIGGER == 0 {
            return Err(inval);
        }
        let end = start.checked_add(count).ok_or(inval)?;
        if end > VECTORS {
            return Err(inval);
        }
        let mut table = self.irqs.0.lock().unwrap_or_else(|e| e.into_inner());
        table.resize_with(VECTORS as usize, || None);
        if flags & vfio::IRQ_SET_DATA_EVENTFD != 0 {
            if fds.len() != count as usize {
                return Err(inval);
            }
            for (slot, fd) in table[start as usize..end as usize].iter_mut().zip(fds) {
                *slot = Some(fd);
            }
        } else if flags & vfio::IRQ_SET_DATA_NONE != 0 && count == 0 {
            table.iter_mut().for_each(|slot| *slot = None);
        } else {
            return Err(inval);
        }
        Ok(())
    }

    /// The device model, built at the first access (the memory map is complete then).
    fn device(&mut self) -> Result<&Device, Refusal> {
        if self.device.is_none() {
            self.device = Some(self.build().map_err(|e| {
                tracing::warn!("nic-server: cannot build the device: {e}");
                libc::EIO as u32
            })?);
        }
        self.device.as_ref().ok_or(libc::EIO as u32)
    }

    fn build(&self) -> Result<Device> {
        if self.dma.is_empty() {
            bail!("no guest memory was mapped before the first access");
        }
        let ranges = self
            .dma
            .iter()
            .map(|d| {
                Ok((
                    GuestAddress(d.address),
                    usize::try_from(d.size)?,
                    Some(FileOffset::new(d.file.try_clone()?, d.offset)),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let memory = GuestMemoryMmap::from_ranges_with_files(ranges)
            .map_err(|e| anyhow::anyhow!("mapping guest memory: {e:?}"))?;
        let net = Arc::new(VirtioNet::new(
            NetConfig {
                mac: self.mac,
                queue_pairs: 1,
                queue_size: QUEUE_SIZE,
            },
            memory,
        )?);
        let transport = Arc::new(VirtioPciDevice::new(
            net.clone(),
            self.irqs.clone(),
            self.served.actions.clone(),
        )?);
        // The client virtualizes MSI-X (enable, masks, table); the model's own table
        // stays enabled and open, so every vector it raises reaches its eventfd.
        let mut cap = [0u8];
        transport.read_config(devices::pci::config::CAPABILITIES_POINTER, &mut cap);
        let _ = transport.write_config(usize::from(cap[0]) + 2, &CONTROL_ENABLE.to_le_bytes());
        for v in 0..u64::from(VECTORS) {
            let entry = transport::MSIX_TABLE_OFFSET + v * devices::pci::msix::ENTRY_SIZE;
            let _ = transport.write_bar(0, entry + 12, &0u32.to_le_bytes());
        }
        self.network.plug(self.served.port, Some(net));
        Ok(Device { transport })
    }

    /// The client went away: the port goes down and the model (with its mappings of
    /// the client's memory) is dropped.
    fn detach(&mut self) {
        if self.device.take().is_some() {
            self.served.actions.act(TransportAction::Reset);
            self.network.plug(self.served.port, None);
            eprintln!(
                "kumo nic-server: port {}: client left; {}",
                self.served.port,
                self.network.worker_stats().line()
            );
        }
        self.irqs
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.dma.clear();
    }
}

/// The NIC server a run uses: one it started (killed and cleaned up when dropped) or
/// one already running at a directory.
pub struct ServerProcess {
    child: Option<std::process::Child>,
    dir: PathBuf,
    /// The switch counters the server printed as clients left, newest last.
    left: Arc<(Mutex<Vec<WorkerStats>>, std::sync::Condvar)>,
}

/// How long a started server may take to open its sockets.
const START_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a server with CPUs of its own polls after its last frame (µs): longer
/// than the gap between a message and its reply in the node's ping-pong (~90 µs half
/// round trip), so a reply's doorbell finds it awake.
pub const OWN_CPU_POLL_US: u64 = 200;

impl ServerProcess {
    /// Starts `kumo nic-server` (this executable) with `ports` ports, port 0 with rank
    /// `first_rank`'s MAC, its threads on `cpus` (empty: any), in a fresh directory;
    /// returns once every socket is there.
    pub fn start(ports: u32, first_rank: u32, cpus: &[usize]) -> Result<ServerProcess> {
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kumo-nic-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let exe = std::env::current_exe().context("finding kumo's own executable")?;
        let mut command = std::process::Command::new(exe);
        command.arg("nic-server");
        if !cpus.is_empty() {
            // CPUs of its own: it polls as hardware would, taking none of the VMs'.
            let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
            command.arg("--cpus").arg(list.join(","));
            command.arg("--poll-us").arg(OWN_CPU_POLL_US.to_string());
        }
        let child = command
            .arg("--seccomp")
            .arg(hv::seccomp::mode().name())
            .arg("--dir")
            .arg(&dir)
            .arg("--ports")
            .arg(ports.to_string())
            .arg("--first-rank")
            .arg(first_rank.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting kumo nic-server")?;
        let mut child = child;
        let left = Arc::new((Mutex::new(Vec::new()), std::sync::Condvar::new()));
        if let Some(stderr) = child.stderr.take() {
            let left = left.clone();
            // Passes the server's log through, keeping the counters it reports.
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                    let Ok(line) = line else { break };
                    match WorkerStats::parse(&line) {
                        Some(stats) => {
                            tracing::debug!("{line}");
                            left.0.lock().unwrap_or_else(|e| e.into_inner()).push(stats);
                            left.1.notify_all();
                        }
                        // Its problems are the run's; its progress notes are not.
                        None if line.contains("driver up") || line.contains("port(s) at") => {
                            tracing::debug!("{line}")
                        }
                        None => eprintln!("{line}"),
                    }
                }
            });
        }
        let mut server = ServerProcess {
            child: Some(child),
            dir,
            left,
        };
        let deadline = std::time::Instant::now() + START_PATIENCE;
        while !(0..ports).all(|k| port_socket(&server.dir, k).exists()) {
            if let Some(child) = &mut server.child
                && let Some(status) = child.try_wait()?
            {
                bail!("kumo nic-server exited before it served ({status})");
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "kumo nic-server did not open its sockets within {} s",
                    START_PATIENCE.as_secs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(server)
    }

    /// A server someone else runs at `dir`.
    pub fn running_at(dir: &Path) -> ServerProcess {
        ServerProcess {
            child: None,
            dir: dir.to_owned(),
            left: Default::default(),
        }
    }

    /// The switch counters of a server this run started, once `clients` clients have
    /// left it (waits at most 2 s for the server to say so).
    pub fn stats_after(&self, clients: usize) -> Option<WorkerStats> {
        self.child.as_ref()?;
        let (list, changed) = &*self.left;
        let list = list.lock().unwrap_or_else(|e| e.into_inner());
        let (list, _) = changed
            .wait_timeout_while(list, std::time::Duration::from_secs(2), |l| {
                l.len() < clients
            })
            .unwrap_or_else(|e| e.into_inner());
        list.last().copied()
    }

    /// The socket of port `port`.
    pub fn socket(&self, port: u32) -> PathBuf {
        port_socket(&self.dir, port)
    }

    /// The server's process id, if this run started it.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[derive(Args, Debug)]
pub struct NicServerArgs {
    /// Seccomp filters on the port threads and the switch (see `kumo --help`).
    #[arg(long, value_name = "MODE", default_value = "kill", value_parser = crate::args::seccomp_mode)]
    pub seccomp: hv::seccomp::Mode,

    /// Directory for the ports' sockets (`DIR/port-K.sock`).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// Ports (NICs) to serve.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub ports: u32,

    /// The MPI rank of port 0's MAC (port K has rank R+K's MAC, as `kumo mpi` gives).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub first_rank: u32,

    /// Host CPUs the server's threads may run on, comma-separated [default: any].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub cpus: Vec<usize>,

    /// Microseconds the switch thread polls for doorbells after its last frame before
    /// it sleeps (hardware does not sleep; give it only with CPUs of its own).
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub poll_us: u64,
}

/// Whether `file` carries `F_SEAL_SHRINK` (a memfd's seal, which no one can lift): its
/// size can then only grow, so pages inside it stay mapped.
fn sealed_against_shrinking(file: &File) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor we own reads its seals; it takes no pointer.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 1 MiB of "guest memory" in a memfd sealed against shrinking, as a client's is.
    fn guest_file(_name: &str) -> File {
        let file = memfd(1 << 20);
        // SAFETY: F_ADD_SEALS on our own descriptor; it takes no pointer.
        let done = unsafe {
            libc::fcntl(
                file.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            )
        };
        assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
        file
    }

    /// A memfd of `len` bytes that may be sealed (and is not yet).
    fn memfd(len: u64) -> File {
        use std::os::fd::FromRawFd;
        // SAFETY: a NUL-terminated name and memfd_create's own flags; checked below.
        let fd = unsafe {
            libc::memfd_create(
                c"kumo-nic-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len).unwrap();
        file
    }

    /// A request with fields near the device's registers, so many reach the model.
    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (
                prop_oneof![Just(0u32), Just(7), 0u32..12],
                0u64..0x8100,
                proptest::collection::vec(any::<u8>(), 1..9)
            )
                .prop_map(|(region, offset, data)| Request::RegionWrite {
                    region,
                    offset,
                    data
                }),
            (prop_oneof![Just(0u32), Just(7)], 0u64..0x8100, 0u32..16).prop_map(
                |(region, offset, count)| Request::RegionRead {
                    region,
                    offset,
                    count
                }
            ),
            (0u32..12).prop_map(|index| Request::GetRegionInfo { index }),
            (0u32..12).prop_map(|index| Request::GetRegionIoFds { index }),
            (0u32..12).prop_map(|index| Request::GetIrqInfo { index }),
            (any::<u32>(), 0u32..6, 0u32..6, 0u32..6).prop_map(|(flags, index, start, count)| {
                Request::SetIrqs {
                    flags,
                    index,
                    start,
                    count,
                }
            }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(offset, address, size)| {
                Request::DmaMap {
                    flags: 3,
                    offset,
                    address,
                    size,
                }
            }),
            Just(Request::DeviceReset),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever a client asks, in whatever order, the server answers (a reply or
        /// an error) without panicking, and never maps memory outside what it was given.
        #[test]
        fn arbitrary_requests_are_answered(
            requests in proptest::collection::vec(request(), 0..60),
            raw in proptest::collection::vec((0u16..16, proptest::collection::vec(any::<u8>(), 0..48)), 0..20),
        ) {
            let network = Network::new(SwitchConfig::default()).unwrap();
            let served = network.add_served_port(QUEUES, [2, 0, 0, 0, 0, 1]).unwrap();
            let mut session = Session {
                served: &served,
                mac: [2, 0, 0, 0, 0, 1],
                network: &network,
                dma: Vec::new(),
                device: None,
                irqs: Arc::new(Irqs::default()),
            };
            prop_assert!(session.map(vec![guest_file("fuzz")], 0, 0, 1 << 20).is_ok());
            for request in requests {
                let _ = session.handle(request, Vec::new());
            }
            for (command, body) in raw {
                if let Ok(request) = Request::parse(command, &body) {
                    let _ = session.handle(request, Vec::new());
                }
            }
            prop_assert!(session.dma.iter().all(|d| d.address + d.size <= 1 << 20));
            session.detach();
        }
    }

    #[test]
    fn dma_maps_must_fit_their_file_and_not_overlap() {
        let network = Network::new(SwitchConfig::default()).unwrap();
        let served = network.add_served_port(QUEUES, [2, 0, 0, 0, 0, 1]).unwrap();
        let mut session = Session {
            served: &served,
            mac: [2, 0, 0, 0, 0, 1],
            network: &network,
            dma: Vec::new(),
            device: None,
            irqs: Arc::new(Irqs::default()),
        };
        let inval = libc::EINVAL as u32;
        assert_eq!(session.map(vec![], 0, 0, 4096), Err(inval), "no descriptor");
        assert_eq!(
            session.map(vec![memfd(1 << 20)], 0, 0, 4096),
            Err(libc::EPERM as u32),
            "a memfd its client could still shrink"
        );
        assert_eq!(
            session.map(vec![guest_file("a")], 0, 0, 2 << 20),
            Err(inval),
            "past the file"
        );
        assert_eq!(
            session.map(vec![guest_file("b")], 0, 100, 4096),
            Err(inval),
            "unaligned"
        );
        assert_eq!(
            session.map(vec![guest_file("c")], u64::MAX - 4095, 0, 4096),
            Err(inval)
        );
        assert_eq!(
            session.map(vec![guest_file("d")], 0, u64::MAX - 4095, 8192),
            Err(inval)
        );
        assert_eq!(session.map(vec![guest_file("e")], 0, 0, 1 << 20), Ok(()));
        assert_eq!(
            session.map(vec![guest_file("f")], 0, 4096, 4096),
            Err(inval),
            "overlap"
        );
        // Once the model is built, the memory map is fixed.
        assert!(session.device().is_ok());
        assert_eq!(
            session.map(vec![guest_file("g")], 0, 2 << 20, 4096),
            Err(libc::EBUSY as u32)
        );
        session.detach();
    }
}
