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

/// One request on a connection of its own, waiting up to `timeout` for the answer
/// (`None`: as long as it takes).
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Option<Duration>,
) -> Result<Reply> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the client's runtime")?;
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
