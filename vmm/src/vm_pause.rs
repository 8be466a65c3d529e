//! `vm.pause` and `vm.resume`: a VM held paused between two API requests. The pause
//! (`hv::migration::Hub::pause`) is a value that resumes the VM when dropped and
//! borrows the hub, so a thread of its own (`kumo-paused`) takes it, reports, and
//! holds it until told to resume (or until this is dropped).

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use hv::migration::Hub;

/// The VM's pause, if it is paused.
#[derive(Default)]
pub struct PauseHold {
    held: Mutex<Option<Held>>,
}

struct Held {
    resume: Sender<()>,
    thread: JoinHandle<()>,
}

impl PauseHold {
    /// Whether the VM is held paused.
    pub fn is_paused(&self) -> bool {
        self.lock().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pauses the VM and keeps it paused; an error (already paused, a snapshot or
    /// migration under way, not running) leaves it as it was.
    pub fn pause(&self, hub: &Arc<Hub>) -> Result<(), String> {
        let mut held = self.lock();
        if held.is_some() {
            return Err("the VM is already paused".into());
        }
        let (paused_tx, paused_rx) = channel::<Result<(), String>>();
        let (resume, resume_rx): (Sender<()>, Receiver<()>) = channel();
        let hub = hub.clone();
        let thread = std::thread::Builder::new()
            .name("kumo-paused".into())
            .spawn(move || match hub.pause() {
                Ok(paused) => {
                    let _ = paused_tx.send(Ok(()));
                    // Until told, or until the hold is dropped (the sender goes).
                    let _ = resume_rx.recv();
                    drop(paused);
                }
                Err(e) => {
                    let _ = paused_tx.send(Err(e.to_string()));
                }
            })
            .map_err(|e| format!("cannot start the pausing thread: {e}"))?;
        match paused_rx.recv() {
            Ok(Ok(())) => {
                *held = Some(Held { resume, thread });
                Ok(())
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err("the pausing thread ended without an answer".into())
            }
        }
    }

    /// Lets the VM run again; an error if it was not paused here.
    pub fn resume(&self) -> Result<(), String> {
        let held = self.lock().take().ok_or("the VM is not paused")?;
        let _ = held.resume.send(());
        let _ = held.thread.join();
        Ok(())
    }
}

impl Drop for PauseHold {
    fn drop(&mut self) {
        let _ = self.resume();
    }
}
