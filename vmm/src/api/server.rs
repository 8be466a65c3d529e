//! The API server: one thread (`kumo-api`) running a tokio current-thread runtime
//! that accepts on the UNIX socket and serves each connection with hyper's HTTP/1.1.
//! A client is never trusted to be quick: each connection has a header deadline, a
//! body deadline and a total deadline (which also ends a client that never reads its
//! answers), bodies have a size limit, and beyond a number of connections a client
//! gets 503 at once. A slow or stuck client costs one connection slot until its
//! deadline, never the server.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;

use super::jobs::{Jobs, Setup};
use super::routes::{self, Answer, Call};
use super::{Controlled, socket};

/// The name of the API's thread (a per-thread-kind seccomp filter keys on it).
pub const THREAD_NAME: &str = "kumo-api";

/// How much a client may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more get 503.
    pub max_connections: usize,
    /// Largest request body (413 beyond).
    pub max_body: usize,
    /// A request's header must arrive within this.
    pub header_timeout: Duration,
    /// A request's body must arrive within this once its header has (408 beyond).
    pub body_timeout: Duration,
    /// A connection is closed this long after it was accepted, whatever it does.
    pub connection_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 128,
            max_body: 64 * 1024,
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(5),
            connection_deadline: Duration::from_secs(60),
        }
    }
}

/// At exit, how long the server waits for a job's client to get its answer.
const DRAIN: Duration = Duration::from_secs(5);

/// The listening socket; removed when dropped.
pub struct Server {
    path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What every connection's handler shares.
struct Shared {
    target: Arc<dyn Controlled>,
    jobs: Jobs,
    limits: Limits,
    /// Connections that asked for a job's answer and are still open.
    answering: AtomicUsize,
}

impl Server {
    /// Binds `path` (mode 0600; a stale socket there is replaced, anything else
    /// refused) and serves `target` from the `kumo-api` thread, which first runs
    /// `setup` and keeps what it returns while it serves (e.g. its membership of
    /// domain 0); job threads run it too.
    pub fn start<K: 'static>(
        path: &Path,
        target: Arc<dyn Controlled>,
        setup: impl Fn() -> K + Send + Sync + 'static,
    ) -> Result<Server> {
        Server::start_with(path, target, setup, Limits::default())
    }

    /// As [`Server::start`], with `limits`.
    pub fn start_with<K: 'static>(
        path: &Path,
        target: Arc<dyn Controlled>,
        setup: impl Fn() -> K + Send + Sync + 'static,
        limits: Limits,
    ) -> Result<Server> {
        socket::remove_stale_socket(path)?;
        let listener = socket::bind_private(path)?;
        listener.set_nonblocking(true)?;
        crate::signals::track_socket(path.to_path_buf());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let setup: Setup = Arc::new(move || Box::new(setup()));
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                let _kept = setup();
                // Its sleeps are reported: the credit driver then need not read
                // `/proc` to learn that domain 0's API thread is idle.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .on_thread_park(|| hv::presence::set_asleep(true))
                    .on_thread_unpark(|| hv::presence::set_asleep(false))
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!("the API cannot start its runtime: {e}");
                        return;
                    }
                };
                // Confined from here on; the job and pause threads it starts inherit
                // the filter (the API's list covers snapshots and migrations).
                hv::seccomp::apply_or_exit(hv::seccomp::ThreadKind::Api);
                let shared = Arc::new(Shared {
                    jobs: Jobs::new(target.clone(), setup),
                    target,
                    limits,
                    answering: AtomicUsize::new(0),
                });
                runtime.block_on(serve(listener, shared, stopped));
            })
            .context("cannot start the API thread")?;
        Ok(Server {
            path: path.to_path_buf(),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Says where the API listens, on stderr in one write: a line another thread
    /// writes meanwhile (a seccomp report) cannot land in the middle of it.
    pub fn announce(&self) {
        use std::io::Write;
        let line = format!("kumo: API socket {}\n", self.path.display());
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
        crate::signals::untrack_socket(&self.path);
    }
}

/// Accepts until told to stop, then lingers (up to [`DRAIN`]) until every job has
/// answered its client.
async fn serve(
    listener: std::os::unix::net::UnixListener,
    shared: Arc<Shared>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("the API cannot watch its socket: {e}");
            return;
        }
    };
    let open = Arc::new(AtomicUsize::new(0));
    let mut drain_until: Option<Instant> = None;
    loop {
        if let Some(until) = drain_until
            && ((shared.jobs.settled() && shared.answering.load(Ordering::SeqCst) == 0)
                || Instant::now() >= until)
        {
            return;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => accept(stream, &shared, &open),
                Err(e) => {
                    tracing::warn!("API socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = &mut stopped, if drain_until.is_none() => {
                drain_until = Some(Instant::now() + DRAIN);
            }
            () = tokio::time::sleep(Duration::from_millis(20)), if drain_until.is_some() => {}
        }
    }
}

/// Serves one client, or tells it 503 if too many are connected.
fn accept(stream: tokio::net::UnixStream, shared: &Arc<Shared>, open: &Arc<AtomicUsize>) {
    let limits = shared.limits;
    if open.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
        open.fetch_sub(1, Ordering::SeqCst);
        tokio::spawn(refuse_busy(stream));
        return;
    }
    let shared = shared.clone();
    let open = open.clone();
    tokio::spawn(async move {
        let asked_job = Arc::new(AtomicBool::new(false));
        let service = {
            let shared = shared.clone();
            let asked_job = asked_job.clone();
            hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                let asked_job = asked_job.clone();
                async move { Ok::<_, Infallible>(handle(request, &shared, &asked_job).await) }
            })
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(16 * 1024)
            .serve_connection(TokioIo::new(stream), service);
        // The total deadline: a client that never reads, or trickles, ends here.
        if tokio::time::timeout(limits.connection_deadline, connection)
            .await
            .is_err()
        {
            tracing::debug!("API client dropped at its deadline");
        }
        if asked_job.load(Ordering::SeqCst) {
            shared.answering.fetch_sub(1, Ordering::SeqCst);
        }
        open.fetch_sub(1, Ordering::SeqCst);
    });
}

/// The answer to a client beyond the connection limit: written with a bound, then
/// the connection closes.
async fn refuse_busy(mut stream: tokio::net::UnixStream) {
    let body = serde_json::to_string(&crate::spec::control::ApiError {
        error: "too many API clients at once; try again".into(),
    })
    .unwrap_or_default();
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(reply.as_bytes())).await;
}

async fn handle(
    request: Request<Incoming>,
    shared: &Shared,
    asked_job: &AtomicBool,
) -> Response<Full<Bytes>> {
    let answer = answer(request, shared, asked_job).await;
    let mut response = Response::builder()
        .status(answer.status)
        .header("content-type", "application/json");
    if let Some(allow) = &answer.allow {
        response = response.header("allow", allow.as_str());
    }
    if let Some(location) = &answer.location {
        response = response.header("location", location.as_str());
    }
    response
        .body(Full::new(Bytes::from(answer.body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"{}"))))
}

async fn answer(request: Request<Incoming>, shared: &Shared, asked_job: &AtomicBool) -> Answer {
    let limits = &shared.limits;
    let matched = match routes::resolve(
        request.method().as_str(),
        request.uri().path(),
        request.uri().query(),
    ) {
        Ok(m) => m,
        Err(answer) => return answer,
    };
    let too_large = || {
        Answer::error(
            413,
            format!("request body over the limit of {} bytes", limits.max_body),
        )
    };
    let declared = request
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return too_large();
    }
    let body = Limited::new(request.into_body(), limits.max_body).collect();
    let body = match tokio::time::timeout(limits.body_timeout, body).await {
        Err(_) => {
            return Answer::error(
                408,
                format!(
                    "request body not received within {} s",
                    limits.body_timeout.as_secs_f64()
                ),
            );
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => return Answer::error(400, format!("bad request body: {e}")),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let call = match routes::parse(&matched, &body) {
        Ok(call) => call,
        Err(answer) => return answer,
    };
    let job = matches!(
        call,
        Call::Snapshot(_) | Call::Migrate(_) | Call::Progress(_)
    );
    if job && !asked_job.swap(true, Ordering::SeqCst) {
        shared.answering.fetch_add(1, Ordering::SeqCst);
    }
    match call {
        Call::Snapshot(request) => shared.jobs.snapshot(request).await,
        Call::Migrate(request) => shared.jobs.migrate(request),
        Call::Progress(id) => shared.jobs.progress(id),
        call => routes::answer(shared.target.as_ref(), call),
    }
}
