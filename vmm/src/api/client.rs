//! A client of the API over its UNIX socket (hyper's HTTP/1.1 client on tokio), for
//! `kumo ctl` (one request per connection, blocking) and `kumo bench api` (a
//! kept-alive connection, async).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// An answer: status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Reply {
    /// The body's `"error"` (every error answer has one), or the raw body.
    pub fn error_message(&self) -> String {
        serde_json::from_slice::<crate::spec::control::ApiError>(&self.body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&self.body).into_owned())
    }
}

/// One kept-alive connection to the API.
pub struct Client {
    sender: SendRequest<Full<Bytes>>,
}

impl Client {
    /// Connects to the API at `socket`; the connection's driver runs as a task of
    /// the current runtime.
    pub async fn connect(socket: &Path) -> Result<Client> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to {} (is a kumo with --api-socket running there?)",
                    socket.display()
                )
            })?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with the API")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("API connection: {e}");
            }
        });
        Ok(Client { sender })
    }

    /// Sends `method path` with `body` (JSON, if any) and reads the answer.
    pub async fn send(&mut self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Reply> {
        self.sender
            .ready()
            .await
            .context("the API closed the connection")?;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "kumo");
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .context("building the request")?;
        let response = self
            .sender
            .send_request(request)
            .await
            .context("the API did not answer")?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .context("reading the API's answer")?
            .to_bytes();
        Ok(Reply { status, body })
    }
}

/// The one-thread runtime every client call drives its connection on.
fn client_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the API client's runtime")
}

/// One request on a connection of its own, waiting up to `timeout` for the answer
/// (`None`: as long as it takes).
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Option<Duration>,
) -> Result<Reply> {
    let runtime = client_runtime()?;
    runtime.block_on(async {
        let exchange = async {
            let mut client = Client::connect(socket).await?;
            client.send(method, path, body).await
        };
        match timeout {
            None => exchange.await,
            Some(limit) => match tokio::time::timeout(limit, exchange).await {
                Ok(reply) => reply,
                Err(_) => bail!(
                    "the kumo at {} sent no reply within {} s",
                    socket.display(),
                    crate::output::seconds(Some(limit))
                ),
            },
        }
    })
}

/// The duration of each of `n` round trips of `GET route` on one kept-alive
/// connection (what a polling tool sees).
pub fn round_trips(socket: &Path, route: &str, n: usize) -> Result<Vec<Duration>> {
    let runtime = client_runtime()?;
    runtime.block_on(async {
        let mut client = Client::connect(socket).await?;
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let start = std::time::Instant::now();
            let reply = client.send("GET", route, None).await?;
            times.push(start.elapsed());
            if reply.status != 200 {
                bail!("GET {route}: {} {}", reply.status, reply.error_message());
            }
        }
        Ok(times)
    })
}

/// What pollers did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollCount {
    /// Answers with status 200.
    pub answered: u64,
    /// Anything else: other statuses, refused connections (the VM not up yet, or
    /// gone), closed connections.
    pub failed: u64,
}

/// `clients` concurrent clients, each on its own kept-alive connection, each
/// sending `GET route` every `interval` until stopped; on one thread
/// (`kumo-api-pollers`) with a tokio current-thread runtime.
pub struct Pollers {
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<PollCount>>,
}

impl Pollers {
    pub fn start(
        socket: &Path,
        route: &str,
        clients: usize,
        interval: Duration,
    ) -> Result<Pollers> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let socket = socket.to_path_buf();
        let route = route.to_string();
        let runtime = client_runtime()?;
        let thread = std::thread::Builder::new()
            .name("kumo-api-pollers".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let tasks: Vec<_> = (0..clients)
                        .map(|_| {
                            tokio::spawn(poll(
                                socket.clone(),
                                route.clone(),
                                interval,
                                stopped.clone(),
                            ))
                        })
                        .collect();
                    let mut total = PollCount::default();
                    for task in tasks {
                        let count = task.await.unwrap_or_default();
                        total.answered += count.answered;
                        total.failed += count.failed;
                    }
                    total
                })
            })
            .context("starting the pollers' thread")?;
        Ok(Pollers {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops every poller and says what they did.
    pub fn stop(mut self) -> PollCount {
        self.finish()
    }

    fn finish(&mut self) -> PollCount {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Pollers {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One poller: reconnects whenever its connection is refused or closed.
async fn poll(
    socket: std::path::PathBuf,
    route: String,
    interval: Duration,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> PollCount {
    let mut count = PollCount::default();
    let mut client: Option<Client> = None;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return count,
            _ = ticks.tick() => {}
        }
        if client.is_none() {
            client = Client::connect(&socket).await.ok();
        }
        let Some(c) = client.as_mut() else {
            count.failed += 1;
            continue;
        };
        match c.send("GET", &route, None).await {
            Ok(reply) if reply.status == 200 => count.answered += 1,
            Ok(_) => count.failed += 1,
            Err(_) => {
                count.failed += 1;
                client = None;
            }
        }
    }
}
