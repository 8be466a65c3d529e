//! Pausing, snapshotting and restoring a running VM (KVM needed).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hv::migration::stream::Reply;
use hv::migration::{self, live, stream};
use hv::testing::{PvhImage, asm, kvm_available};
use hv::{GuestExit, Vm, VmConfig};
use vm_memory::{Bytes, GuestAddress};

/// Where the guest keeps its counter (free RAM above the kernel).
const COUNTER: u32 = 0x20_0000;
/// Iterations of the guest's loop (~3 emulated instructions each).
const ITERATIONS: u32 = 100_000;

/// Counts `[COUNTER]` up to ITERATIONS, prints "done", exits with the counter.
fn counting_guest() -> Vec<u8> {
    let mut code = vec![0xff, 0x05]; // inc dword [COUNTER]
    code.extend_from_slice(&COUNTER.to_le_bytes());
    code.extend_from_slice(&[0x81, 0x3d]); // cmp dword [COUNTER], ITERATIONS
    code.extend_from_slice(&COUNTER.to_le_bytes());
    code.extend_from_slice(&ITERATIONS.to_le_bytes());
    code.extend_from_slice(&[0x72, (-18i8) as u8]); // jb back to the inc
    code.extend(asm::com1_print(b"done\n"));
    code.push(0xa1); // mov eax, [COUNTER]
    code.extend_from_slice(&COUNTER.to_le_bytes());
    code.extend_from_slice(&[0xe7, 0xf4]); // out 0xf4, eax
    PvhImage::new(&code).build()
}

fn config(vcpus: u32) -> VmConfig {
    VmConfig {
        vcpus,
        memory_mib: 64,
        kernel: counting_guest().into(),
        cmdline: String::new(),
        modules: Vec::new(),
        kvm_device: "/dev/kvm".into(),
        huge_pages: false,
    }
}

#[derive(Clone, Default)]
struct Console(Arc<Mutex<Vec<u8>>>);

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn counter(vm_memory: &vm_memory::GuestMemoryMmap) -> u32 {
    vm_memory
        .read_obj(GuestAddress(u64::from(COUNTER)))
        .unwrap()
}

/// Waits until the guest has counted to `at_least` (it is running, not finished).
fn wait_for_count(memory: &vm_memory::GuestMemoryMmap, at_least: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter(memory) < at_least {
        assert!(Instant::now() < deadline, "the guest never counted");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A VM of `vcpus` running the counting guest on a thread (console discarded),
/// once it has counted a little: its hub, its RAM and its run.
fn counting(
    vcpus: u32,
) -> (
    Arc<migration::Hub>,
    vm_memory::GuestMemoryMmap,
    std::thread::JoinHandle<Result<hv::RunOutcome, hv::Error>>,
) {
    let vm = hv::builder::build_for_boot(config(vcpus)).unwrap();
    let hub = vm.migration_hub();
    let memory = vm.memory().clone();
    let runner = std::thread::spawn(move || vm.run(Box::new(std::io::sink()), Instant::now()));
    wait_for_count(&memory, 100);
    (hub, memory, runner)
}

#[test]
fn a_paused_vm_resumes_and_finishes() {
    if !kvm_available() {
        return;
    }
    let vm = hv::builder::build_for_boot(config(2)).unwrap();
    let hub = vm.migration_hub();
    // Not running yet: refused before anything (a migration checks this before it
    // connects to its destination).
    let refused = hub.check_running().unwrap_err().to_string();
    assert!(refused.contains("not running yet"), "{refused}");
    let memory = vm.memory().clone();
    let console = Console::default();
    let out = console.clone();
    let runner = std::thread::spawn(move || vm.run(Box::new(out), Instant::now()));
    wait_for_count(&memory, 100);
    hub.check_running().expect("running");
    let paused = hub.pause().expect("pause");
    assert_eq!(paused.vcpus().len(), 2);
    let frozen = counter(&memory);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(counter(&memory), frozen, "no vCPU runs while paused");
    assert!(frozen < ITERATIONS, "paused midway");
    drop(paused);
    let outcome = runner.join().unwrap().unwrap();
    assert_eq!(outcome.exit, GuestExit::DebugExit(ITERATIONS));
    assert_eq!(&*console.0.lock().unwrap(), b"done\n");
}

/// A vCPU a scheduler parked is outside the guest already: a pause takes its state at
/// its gate. Before, the pause waited for the scheduler to unpark it (on S5's capped
/// host a migration's downtime grew to 1 s); here nothing ever unparks it.
#[test]
fn a_parked_vcpu_pauses_without_being_let_back_in() {
    if !kvm_available() {
        return;
    }
    let vm = hv::builder::build_for_boot(config(2)).unwrap();
    let hub = vm.migration_hub();
    let control = vm.control();
    let memory = vm.memory().clone();
    let runner = std::thread::spawn(move || vm.run(Box::new(std::io::sink()), Instant::now()));
    wait_for_count(&memory, 100);
    // Both vCPU threads exist (the second may start after the first has counted).
    assert!(control.wait_started(Duration::from_secs(10)));
    control.park(0).unwrap();
    control.park(1).unwrap();
    // Both are held once the counter stops moving.
    let mut last = counter(&memory);
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let now = counter(&memory);
        if now == last {
            break;
        }
        last = now;
    }
    let paused = hub
        .pause_within(Duration::from_secs(10))
        .expect("parked vCPUs pause at their gates");
    assert_eq!(paused.vcpus().len(), 2);
    drop(paused);
    // Resumed, they are still parked: the guest has not counted on.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        counter(&memory),
        last,
        "the pause let no parked vCPU into the guest"
    );
    control.unpark(0);
    control.unpark(1);
    let outcome = runner.join().unwrap().unwrap();
    assert_eq!(outcome.exit, GuestExit::DebugExit(ITERATIONS));
}

#[test]
fn a_snapshot_taken_midway_restores_and_finishes() {
    if !kvm_available() {
        return;
    }
    // One vCPU; two and four, whose APs wait for SIPI (their MP state moves too).
    for vcpus in [1, 2, 4] {
        snapshot_midway(vcpus);
    }
}

fn snapshot_midway(vcpus: u32) {
    let vm = hv::builder::build_for_boot(config(vcpus)).unwrap();
    let hub = vm.migration_hub();
    let memory = vm.memory().clone();
    let runner = std::thread::spawn(move || vm.run(Box::new(std::io::sink()), Instant::now()));
    wait_for_count(&memory, 100);
    let mut bytes = Vec::new();
    let (paused, written) = migration::write_snapshot(&hub, &mut bytes, || "app".into()).unwrap();
    let saved_count = counter(&memory);
    paused.hand_off();
    assert_eq!(runner.join().unwrap().unwrap().exit, GuestExit::HandedOff);
    assert!(saved_count > 0 && saved_count < ITERATIONS);
    assert!(
        written.pages > 0 && (written.pages as usize) < 64 * 256,
        "holes skipped"
    );

    // The stream parses, and holds the counter as it was.
    let parsed = stream::parse(&mut &bytes[..]).unwrap();
    assert_eq!(parsed.meta.app, "app");
    assert_eq!(parsed.vcpus.len(), vcpus as usize);
    let page = parsed
        .pages
        .iter()
        .find(|(gpa, _)| *gpa == u64::from(COUNTER))
        .and_then(|(_, b)| b.as_ref())
        .expect("the counter's page is saved");
    assert_eq!(
        u32::from_le_bytes(page[..4].try_into().unwrap()),
        saved_count
    );

    let (restored, meta) =
        hv::builder::build_from_snapshot(&mut &bytes[..], std::path::Path::new("/dev/kvm"))
            .unwrap();
    assert_eq!(meta.vcpus, vcpus);
    assert_eq!(counter(restored.memory()), saved_count);
    let console = Console::default();
    let outcome = restored
        .run(Box::new(console.clone()), Instant::now())
        .unwrap();
    assert_eq!(outcome.exit, GuestExit::DebugExit(ITERATIONS));
    assert_eq!(&*console.0.lock().unwrap(), b"done\n");
}

#[test]
fn a_corrupted_snapshot_is_refused() {
    if !kvm_available() {
        return;
    }
    let (hub, _, runner) = counting(1);
    let mut bytes = Vec::new();
    let (paused, _) = migration::write_snapshot(&hub, &mut bytes, String::new).unwrap();
    drop(paused); // resumes: the source finishes on its own
    assert_eq!(
        runner.join().unwrap().unwrap().exit,
        GuestExit::DebugExit(ITERATIONS)
    );
    let mut bad = bytes.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x40;
    let err = hv::builder::build_from_snapshot(&mut &bad[..], std::path::Path::new("/dev/kvm"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum"), "{err}");
    let err = hv::builder::build_from_snapshot(&mut &bytes[..bytes.len() - 5], "/dev/kvm".as_ref())
        .unwrap_err()
        .to_string();
    assert!(err.contains("truncated"), "{err}");
}

/// Runs the destination side on a thread: receive from `b` (acknowledging each
/// round), confirm, run.
fn destination(
    b: std::os::unix::net::UnixStream,
    console: Console,
) -> std::thread::JoinHandle<Result<(String, u32, GuestExit), String>> {
    std::thread::spawn(move || {
        let (vm, meta) = receive_acking(&b).map_err(|e| e.to_string())?;
        let restored_count = counter(vm.memory());
        stream::write_reply(&mut &b, Reply::Running).map_err(|e| e.to_string())?;
        let outcome = vm
            .run(Box::new(console), Instant::now())
            .map_err(|e| e.to_string())?;
        Ok((meta.app, restored_count, outcome.exit))
    })
}

/// Migrates the VM behind `hub` over `a` with the default options (the program's
/// descriptions empty).
fn send_over(
    hub: &migration::Hub,
    a: &std::os::unix::net::UnixStream,
) -> Result<live::Report, hv::Error> {
    let mut w = std::io::BufWriter::new(a.try_clone().unwrap());
    live::send(
        hub,
        &mut w,
        String::new(),
        String::new,
        &live::Options::default(),
        &mut Replies(a.try_clone().unwrap()),
    )
}

/// Receives a VM from `b`, acknowledging each round as a destination does.
fn receive_acking(b: &std::os::unix::net::UnixStream) -> Result<(Vm, migration::Meta), hv::Error> {
    let mut r = std::io::BufReader::new(b.try_clone().unwrap());
    hv::builder::build_incoming(&mut r, std::path::Path::new("/dev/kvm"), |round| {
        stream::write_reply(&mut &*b, Reply::Applied(round)).map_err(hv::Error::from)
    })
}

/// The destination's replies as the source reads them from `a` (its read timeout
/// bounds each wait).
struct Replies(std::os::unix::net::UnixStream);

impl live::Destination for Replies {
    fn applied(&mut self, round: u32) -> Result<(), hv::Error> {
        live::await_applied(&mut &self.0, round)
    }
    fn running(&mut self) -> Result<(), hv::Error> {
        live::await_running(&mut &self.0)
    }
}

#[test]
fn a_running_vm_migrates_with_dirty_rounds_and_finishes_on_the_destination() {
    if !kvm_available() {
        return;
    }
    let (hub, memory, runner) = counting(2);
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let console = Console::default();
    let dest = destination(b, console.clone());
    let mut w = std::io::BufWriter::new(a.try_clone().unwrap());
    // No downtime target is met while pages are dirty: rounds until the cap.
    let options = live::Options {
        max_downtime: Duration::ZERO,
        max_rounds: 2,
        stop_and_copy: false,
    };
    let report = live::send(
        &hub,
        &mut w,
        "start".into(),
        || "final".into(),
        &options,
        &mut Replies(a.try_clone().unwrap()),
    )
    .unwrap();
    assert_eq!(runner.join().unwrap().unwrap().exit, GuestExit::HandedOff);
    // Rounds go on while pages are dirty, up to the cap (how many depends on how
    // much the guest ran meanwhile).
    assert!((1..=3).contains(&report.rounds.len()), "{report:?}");
    let (app, restored_count, exit) = dest.join().unwrap().unwrap();
    // The counter's page changes all the time: whatever round last carried it, the
    // destination must start from the value the source stopped at.
    assert_eq!(restored_count, counter(&memory));
    assert_eq!(app, "final", "the final APPS section replaces META's");
    assert_eq!(exit, GuestExit::DebugExit(ITERATIONS));
    assert_eq!(&*console.0.lock().unwrap(), b"done\n");
}

/// A stand-in for a NIC's receive path: it writes guest RAM from a host thread
/// (unseen by KVM's dirty log) while tracking is on — once, when asked the second
/// time (the first is when tracking starts; the second follows the full pass, so
/// only the record can bring the page across) — and reports the page.
struct HostWriter {
    memory: vm_memory::GuestMemoryMmap,
    tracking: Mutex<bool>,
    asked: Mutex<u32>,
}

/// Where the host writer writes (a page the counting guest never touches).
const DEVICE_PAGE: u64 = 0x30_0000;

impl migration::DeviceWrites for HostWriter {
    fn track(&self, on: bool) {
        *self.tracking.lock().unwrap() = on;
    }
    fn take_written(&self) -> Vec<u64> {
        let mut asked = self.asked.lock().unwrap();
        *asked += 1;
        if !*self.tracking.lock().unwrap() || *asked != 2 {
            return Vec::new();
        }
        self.memory
            .write_obj(0xfeed_f00du32, GuestAddress(DEVICE_PAGE + 8))
            .unwrap();
        vec![DEVICE_PAGE + 8]
    }
}

#[test]
fn pages_a_device_writes_during_the_rounds_reach_the_destination() {
    if !kvm_available() {
        return;
    }
    let (hub, memory, runner) = counting(1);
    let writer = Arc::new(HostWriter {
        memory: memory.clone(),
        tracking: Mutex::new(false),
        asked: Mutex::new(0),
    });
    hub.add_device_writes(writer.clone());
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let dest = std::thread::spawn(move || {
        let (vm, _) = receive_acking(&b).unwrap();
        let seen: u32 = vm.memory().read_obj(GuestAddress(DEVICE_PAGE + 8)).unwrap();
        stream::write_reply(&mut &b, Reply::Running).unwrap();
        seen
    });
    send_over(&hub, &a).unwrap();
    assert!(
        *writer.asked.lock().unwrap() >= 2,
        "the device wrote during the migration"
    );
    assert!(
        !*writer.tracking.lock().unwrap(),
        "tracking ends with the migration"
    );
    assert_eq!(
        dest.join().unwrap(),
        0xfeed_f00d,
        "the device's page was sent again"
    );
    assert_eq!(runner.join().unwrap().unwrap().exit, GuestExit::HandedOff);
}

#[test]
fn without_confirmation_the_source_runs_on() {
    if !kvm_available() {
        return;
    }
    let (hub, _, runner) = counting(1);
    /// Applies every round, then is gone before it runs the VM.
    struct GoneAtTheEnd;
    impl live::Destination for GoneAtTheEnd {
        fn applied(&mut self, _: u32) -> Result<(), hv::Error> {
            Ok(())
        }
        fn running(&mut self) -> Result<(), hv::Error> {
            Err(hv::Error::Migration("the destination went away".into()))
        }
    }
    let mut sink = Vec::new();
    let err = live::send(
        &hub,
        &mut sink,
        String::new(),
        String::new,
        &live::Options::default(),
        &mut GoneAtTheEnd,
    )
    .unwrap_err();
    assert!(err.to_string().contains("went away"));
    assert!(!sink.is_empty());
    assert_eq!(
        runner.join().unwrap().unwrap().exit,
        GuestExit::DebugExit(ITERATIONS),
        "the source resumed and finished"
    );
}

#[test]
fn a_destination_that_never_acknowledges_a_round_leaves_the_source_running() {
    if !kvm_available() {
        return;
    }
    let (hub, _, runner) = counting(1);
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    // Reads everything, answers nothing.
    let silent = std::thread::spawn(move || std::io::copy(&mut &b, &mut std::io::sink()));
    a.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let err = send_over(&hub, &a).unwrap_err().to_string();
    assert!(
        err.contains("did not acknowledge round 0: no reply in time"),
        "{err}"
    );
    drop(a);
    assert!(
        silent.join().unwrap().unwrap() > 0,
        "the first round was sent"
    );
    assert_eq!(
        runner.join().unwrap().unwrap().exit,
        GuestExit::DebugExit(ITERATIONS),
        "the source never paused and finished"
    );
}

#[test]
fn a_vcpu_that_cannot_stop_fails_the_pause_and_the_vm_runs_on() {
    if !kvm_available() {
        return;
    }
    let vm = hv::builder::build_for_boot(config(1)).unwrap();
    let hub = vm.migration_hub();
    let memory = vm.memory().clone();
    let console = Console::default();
    let out = console.clone();
    // Held in its console write (the test holds the console), the vCPU never reaches
    // its pause point. (A vCPU a scheduler parked pauses at its gate: see
    // `a_parked_vcpu_pauses_without_being_let_back_in`.)
    let held = console.0.lock().unwrap();
    let runner = std::thread::spawn(move || vm.run(Box::new(out), Instant::now()));
    wait_for_count(&memory, ITERATIONS);
    let err = hub
        .pause_within(Duration::from_millis(100))
        .unwrap_err()
        .to_string();
    assert!(err.contains("vCPU 0 did not stop"), "{err}");
    drop(held);
    assert_eq!(
        runner.join().unwrap().unwrap().exit,
        GuestExit::DebugExit(ITERATIONS),
        "the VM ran on to its end"
    );
    assert_eq!(&*console.0.lock().unwrap(), b"done\n");
}
