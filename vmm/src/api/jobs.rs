//! The slow requests, off the API thread: a snapshot (answered when done) and
//! migrations (answered at once with 202 and a progress resource). Each runs on a
//! thread of its own named `kumo-api-job`, synchronous like the rest of the VMM,
//! which first runs the server's `setup` (e.g. joins domain 0, as the API thread does).

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::routes::Answer;
use super::{Controlled, Refused};
use crate::spec::control::{MigrateRequest, MigrationProgress, MigrationReply, MigrationState};

/// What every thread of the API runs first, keeping what it returns while it works.
pub type Setup = Arc<dyn Fn() -> Box<dyn Any> + Send + Sync>;

/// How many finished migrations are kept for `GET vm.migrate/{id}`.
const KEPT: usize = 16;

/// Migrations started through the API, and jobs under way.
pub struct Jobs {
    target: Arc<dyn Controlled>,
    setup: Setup,
    running: Arc<AtomicUsize>,
    migrations: Arc<Mutex<Vec<Record>>>,
    next_id: Mutex<u64>,
}

struct Record {
    id: u64,
    target: String,
    domain: Option<String>,
    started: Instant,
    finished: Option<(Instant, Result<MigrationReply, String>)>,
    /// Its outcome was read (the server lingers at exit until it is).
    fetched: bool,
}

impl Record {
    fn progress(&self) -> MigrationProgress {
        let (state, elapsed, result, error) = match &self.finished {
            None => (MigrationState::Running, self.started.elapsed(), None, None),
            Some((at, Ok(reply))) => (
                MigrationState::Succeeded,
                *at - self.started,
                Some(reply.clone()),
                None,
            ),
            Some((at, Err(e))) => (
                MigrationState::Failed,
                *at - self.started,
                None,
                Some(e.clone()),
            ),
        };
        MigrationProgress {
            id: self.id,
            state,
            target: self.target.clone(),
            domain: self.domain.clone(),
            elapsed_ms: elapsed.as_secs_f64() * 1e3,
            result,
            error,
        }
    }
}

impl Jobs {
    pub fn new(target: Arc<dyn Controlled>, setup: Setup) -> Jobs {
        Jobs {
            target,
            setup,
            running: Arc::new(AtomicUsize::new(0)),
            migrations: Arc::new(Mutex::new(Vec::new())),
            next_id: Mutex::new(1),
        }
    }

    /// Runs `work` on a job thread; the receiver gets its answer.
    fn spawn(
        &self,
        work: impl FnOnce(&dyn Controlled) -> Answer + Send + 'static,
    ) -> Result<tokio::sync::oneshot::Receiver<Answer>, Refused> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let target = self.target.clone();
        let setup = self.setup.clone();
        let running = self.running.clone();
        running.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("kumo-api-job".into())
            .spawn(move || {
                let _kept = setup();
                let answer = work(target.as_ref());
                // The client may have gone: the work is done all the same.
                let _ = tx.send(answer);
                running.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            self.running.fetch_sub(1, Ordering::SeqCst);
            return Err(Refused::failed(format!("cannot start a job thread: {e}")));
        }
        Ok(rx)
    }

    /// `PUT vm.snapshot`: answered once the file is written.
    pub async fn snapshot(&self, request: crate::spec::control::SnapshotRequest) -> Answer {
        let rx = match self
            .spawn(move |target| Answer::of(target.snapshot(&request.path, request.stop)))
        {
            Ok(rx) => rx,
            Err(refused) => return Answer::refused(refused),
        };
        rx.await
            .unwrap_or_else(|_| Answer::error(500, "the snapshot job ended without an answer"))
    }

    /// `PUT vm.migrate`: checked at once, then 202 and the progress resource while
    /// the migration runs on its own thread.
    pub fn migrate(&self, request: MigrateRequest) -> Answer {
        if let Err(refused) = self.target.check_migrate(&request) {
            return Answer::refused(refused);
        }
        let id = {
            let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
            let id = *next;
            *next += 1;
            id
        };
        let record = Record {
            id,
            target: request.target.clone(),
            domain: request.domain.clone(),
            started: Instant::now(),
            finished: None,
            fetched: false,
        };
        let progress = record.progress();
        {
            let mut records = self.migrations.lock().unwrap_or_else(|e| e.into_inner());
            // Forget the oldest finished ones; running ones always stay.
            while records.len() >= KEPT {
                match records.iter().position(|r| r.finished.is_some()) {
                    Some(i) => drop(records.remove(i)),
                    None => break,
                }
            }
            records.push(record);
        }
        let migrations = self.migrations.clone();
        let spawned = self.spawn(move |target| {
            let outcome = target.migrate(&request).map_err(|r| r.message);
            let mut records = migrations.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = records.iter_mut().find(|r| r.id == id) {
                r.finished = Some((Instant::now(), outcome));
            }
            Answer::json(200, &())
        });
        if let Err(refused) = spawned {
            self.migrations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|r| r.id != id);
            return Answer::refused(refused);
        }
        let mut answer = Answer::json(202, &progress);
        answer.location = Some(format!("/api/v1/vm.migrate/{id}"));
        answer
    }

    /// `GET vm.migrate/{id}`.
    pub fn progress(&self, id: u64) -> Answer {
        let mut records = self.migrations.lock().unwrap_or_else(|e| e.into_inner());
        match records.iter_mut().find(|r| r.id == id) {
            Some(record) => {
                record.fetched |= record.finished.is_some();
                Answer::json(200, &record.progress())
            }
            None => Answer::error(404, format!("no migration {id}")),
        }
    }

    /// No job runs and every finished migration's outcome was read: the server may
    /// close without leaving a client without its answer.
    pub fn settled(&self) -> bool {
        self.running.load(Ordering::SeqCst) == 0
            && self
                .migrations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .all(|r| r.fetched)
    }
}
