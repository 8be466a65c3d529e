//! The API against a fake run: routes, statuses, and clients that misbehave.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::routes::{self, Answer, Call};
use super::*;
use crate::spec::control::{Accounting, RunKind, RunState};

struct Fake {
    params: Mutex<SchedParams>,
    weight: Mutex<u32>,
}

impl SchedTarget for Fake {
    fn sched_params(&self) -> SchedParams {
        *self.params.lock().unwrap()
    }
    fn set_sched_params(&self, u: SchedUpdate) -> Result<SchedParams, Refused> {
        let mut p = self.params.lock().unwrap();
        if let Some(t) = u.tslice_ms {
            if t < 0.1 {
                return Err(Refused::bad("tslice_ms 0.01 is outside 0.1..=1000"));
            }
            p.tslice_ms = t;
        }
        if let Some(r) = u.ratelimit_us {
            p.ratelimit_us = r;
        }
        Ok(*p)
    }
    fn domains(&self) -> Vec<DomainInfo> {
        vec![DomainInfo {
            domain: "a b".into(),
            weight: *self.weight.lock().unwrap(),
            cap: 0,
            vcpus: 1,
            cpu_s: 0.5,
            progress: None,
        }]
    }
    fn set_domain(
        &self,
        _name: &str,
        w: Option<u32>,
        _c: Option<u32>,
    ) -> Result<DomainInfo, Refused> {
        if let Some(w) = w {
            *self.weight.lock().unwrap() = w;
        }
        Ok(SchedTarget::domains(self).remove(0))
    }
    fn vcpu_balloon(&self, _: Option<&str>, _: Option<u32>) -> Result<BalloonState, Refused> {
        Err(Refused::bad("no balloon here"))
    }
    fn info(&self) -> VmInfo {
        VmInfo {
            kind: RunKind::Node,
            state: RunState::Running,
            vcpus: 1,
            domains: 1,
            pid: std::process::id(),
            credit_scheduler: true,
        }
    }
    fn counters(&self) -> Counters {
        Counters { vcpus: Vec::new() }
    }
}

impl Controlled for Fake {
    fn sched(&self) -> &dyn SchedTarget {
        self
    }
}

fn fake() -> Arc<Fake> {
    Arc::new(Fake {
        params: Mutex::new(SchedParams {
            tslice_ms: 30.0,
            tick_ms: 10.0,
            ratelimit_us: 1000,
            accounting: Accounting::Exact,
            directed_yield: false,
            auto_slice: false,
        }),
        weight: Mutex::new(256),
    })
}

/// `method path body` through routing and parsing, answered by `target`.
fn ask(target: &dyn Controlled, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    let answer = routes::resolve(method, path, query)
        .and_then(|m| routes::parse(&m, body.as_bytes()))
        .map_or_else(|a| a, |call| routes::answer(target, call));
    (answer.status, serde_json::from_slice(&answer.body).unwrap())
}

#[test]
fn routes_answer_and_refuse_with_the_right_status() {
    let f = fake();
    let t = f.as_ref();
    let (status, shown) = ask(t, "GET", "/api/v1/sched.credit", "");
    assert_eq!((status, shown["tslice_ms"].clone()), (200, json!(30.0)));
    let (status, set) = ask(t, "PUT", "/api/v1/sched.credit", r#"{"tslice_ms":1}"#);
    assert_eq!((status, set["tslice_ms"].clone()), (200, json!(1.0)));
    let (status, out) = ask(t, "PUT", "/api/v1/sched.credit", r#"{"tslice_ms":0.01}"#);
    assert_eq!(status, 400);
    assert!(out["error"].as_str().unwrap().contains("0.1..=1000"));
    // A percent-encoded domain name.
    let (status, set) = ask(t, "PUT", "/api/v1/domains/a%20b", r#"{"weight":512}"#);
    assert_eq!((status, set["weight"].clone()), (200, json!(512)));
    let (status, _) = ask(t, "GET", "/api/v1/domains/a%20b", "");
    assert_eq!(status, 200);
    for (method, path, body, wanted, needle) in [
        ("GET", "/api/v1/domains/zz", "", 404, "no domain 'zz'"),
        (
            "PUT",
            "/api/v1/domains/zz",
            r#"{"cap":1}"#,
            404,
            "no domain",
        ),
        (
            "PUT",
            "/api/v1/domains/a%20b",
            "{}",
            400,
            "weight and/or cap",
        ),
        ("GET", "/api/v1/nothing", "", 404, "no such resource"),
        ("GET", "/api/v2/vm.info", "", 404, "no such resource"),
        ("DELETE", "/api/v1/vm.info", "", 405, "use GET"),
        ("GET", "/api/v1/vm.pause", "", 405, "use PUT"),
        ("GET", "/api/v1/vm.info?x=1", "", 400, "takes no query"),
        ("GET", "/api/v1/vm.balloon?dom=a", "", 400, "domain=NAME"),
        ("GET", "/api/v1/vm.info", "{}", 400, "takes no body"),
        ("PUT", "/api/v1/sched.credit", "{", 400, "bad request body"),
        ("PUT", "/api/v1/sched.credit", "[]", 400, "bad request body"),
        (
            "PUT",
            "/api/v1/sched.credit",
            r#"{"tslice":1}"#,
            400,
            "unknown field `tslice`",
        ),
        (
            "PUT",
            "/api/v1/vm.snapshot",
            r#"{"stop":true}"#,
            400,
            "missing field `path`",
        ),
        (
            "PUT",
            "/api/v1/vm.migrate",
            r#"{"target":"tcp:h:1","x":1}"#,
            400,
            "unknown field `x`",
        ),
        (
            "PUT",
            "/api/v1/vm.pause",
            r#"{"now":1}"#,
            400,
            "unknown field `now`",
        ),
        ("GET", "/api/v1/vm.migrate/abc", "", 404, "no migration"),
        // A node has no single VM to pause.
        ("PUT", "/api/v1/vm.pause", "", 409, "one VM"),
        ("PUT", "/api/v1/vm.resume", "{}", 409, "one VM"),
        (
            "PUT",
            "/api/v1/vm.balloon",
            r#"{"active":1}"#,
            400,
            "no balloon here",
        ),
    ] {
        let (status, out) = ask(t, method, path, body);
        assert_eq!(status, wanted, "{method} {path} {body}: {out}");
        let message = out["error"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{method} {path}: {message}");
        assert!(!message.contains('\n'), "{message}");
    }
    assert_eq!(Controlled::sched_params(t).tslice_ms, 1.0);
}

#[test]
fn every_route_in_the_table_resolves_to_its_own_call() {
    for (method, template) in routes::ROUTES {
        let path = template.replace("{id}", "7").replace("{name}", "a%20b");
        let body = match (*method, *template) {
            ("PUT", "/api/v1/vm.snapshot") => r#"{"path":"/x"}"#,
            ("PUT", "/api/v1/vm.migrate") => r#"{"target":"tcp:h:1"}"#,
            ("PUT", "/api/v1/vm.balloon") => r#"{"active":1}"#,
            ("PUT", "/api/v1/domains/{name}") => r#"{"cap":1}"#,
            ("PUT", _) => "{}",
            _ => "",
        };
        let matched = routes::resolve(method, &path, None).unwrap();
        let call = routes::parse(&matched, body.as_bytes()).unwrap();
        if let Call::DomainShow(name) | Call::DomainSet(name, _) = &call {
            assert_eq!(name, "a b");
        }
        if let Call::Progress(id) = call {
            assert_eq!(id, 7);
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kumo-api-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A raw HTTP exchange on one connection: writes `request`, reads to EOF.
fn raw(path: &Path, request: &[u8]) -> String {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn get(path: &Path, route: &str) -> client::Reply {
    client::request(path, "GET", route, None, Some(Duration::from_secs(30))).unwrap()
}

#[test]
fn the_socket_is_private_and_serves_http() {
    let dir = scratch("private");
    let path = dir.join("api.sock");
    let server = Server::start(&path, fake(), || ()).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let reply = get(&path, "/api/v1/domains");
    assert_eq!(reply.status, 200);
    let list: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(list["domains"][0]["domain"], "a b");
    // A second server on a live socket is refused; a dropped one cleans up.
    let err = Server::start(&path, fake(), || ()).err().expect("refused");
    assert!(format!("{err:#}").contains("in use"), "{err:#}");
    drop(server);
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn only_a_socket_proven_stale_is_replaced() {
    let dir = scratch("stale");
    let path = dir.join("api.sock");
    // A regular file is not a socket: refused and left alone.
    std::fs::write(&path, b"precious").unwrap();
    let err = Server::start(&path, fake(), || ()).err().expect("refused");
    assert!(format!("{err:#}").contains("not a socket"), "{err:#}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    std::fs::remove_file(&path).unwrap();
    // A symbolic link (even to a stale socket) is not followed, nor removed.
    let stale = dir.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    std::os::unix::fs::symlink(&stale, &path).unwrap();
    let err = Server::start(&path, fake(), || ()).err().expect("refused");
    assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
    assert!(path.symlink_metadata().unwrap().file_type().is_symlink());
    assert!(stale.exists());
    std::fs::remove_file(&path).unwrap();
    // A directory neither.
    std::fs::create_dir(&path).unwrap();
    assert!(Server::start(&path, fake(), || ()).is_err());
    assert!(path.is_dir());
    std::fs::remove_dir(&path).unwrap();
    // A socket nobody listens on (a crashed kumo's) is replaced.
    drop(UnixListener::bind(&path).unwrap());
    let server = Server::start(&path, fake(), || ()).unwrap();
    assert_eq!(get(&path, "/api/v1/vm.info").status, 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_requests_get_one_clear_error_each() {
    let dir = scratch("bad");
    let path = dir.join("api.sock");
    let limits = Limits {
        max_body: 1024,
        ..Limits::default()
    };
    let _server = Server::start_with(&path, fake(), || (), limits).unwrap();
    let put = |body: &str| {
        format!(
            "PUT /api/v1/sched.credit HTTP/1.1\r\nhost: k\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let big = format!(r#"{{"tslice_ms":1{}}}"#, " ".repeat(2000));
    for (request, wanted, needle) in [
        (put("{\"tslice_ms\":"), 400, "bad request body"),
        (
            put(r#"{"tslice_ms":1,"bogus":2}"#),
            400,
            "unknown field `bogus`",
        ),
        (put(&big), 413, "over the limit of 1024 bytes"),
        // A chunked body over the limit, its length not declared.
        (
            format!(
                "PUT /api/v1/sched.credit HTTP/1.1\r\nhost: k\r\ntransfer-encoding: chunked\r\n\
                 connection: close\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
                big.len()
            ),
            413,
            "over the limit",
        ),
        (
            "DELETE /api/v1/vm.info HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\r\n".into(),
            405,
            "use GET",
        ),
        (
            "GET /nothing HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\r\n".into(),
            404,
            "no such resource",
        ),
    ] {
        let response = raw(&path, request.as_bytes());
        assert_eq!(status_of(&response), wanted, "{response}");
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let error: Value = serde_json::from_str(body).unwrap();
        assert!(
            error["error"].as_str().unwrap().contains(needle),
            "{response}"
        );
    }
    // Nothing it was sent changed the scheduler.
    assert_eq!(get(&path, "/api/v1/sched.credit").status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Short limits so the misbehaving clients meet them quickly.
fn short() -> Limits {
    Limits {
        max_connections: 4,
        max_body: 1024,
        header_timeout: Duration::from_millis(300),
        body_timeout: Duration::from_millis(300),
        connection_deadline: Duration::from_secs(2),
    }
}

/// Reads until the server closes the connection, or `limit` passes.
fn closed_within(stream: &mut UnixStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn a_slow_client_is_dropped_and_the_others_are_served() {
    let dir = scratch("slow");
    let path = dir.join("api.sock");
    let _server = Server::start_with(&path, fake(), || (), short()).unwrap();
    // One byte of a header at a time, slower than the header deadline.
    let mut slow = UnixStream::connect(&path).unwrap();
    let request = b"GET /api/v1/vm.info HTTP/1.1\r\nhost: k\r\n\r\n";
    let mut dropped = false;
    for byte in request {
        assert_eq!(get(&path, "/api/v1/vm.info").status, 200);
        if slow.write_all(&[*byte]).is_err() {
            dropped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        dropped || closed_within(&mut slow, Duration::from_secs(30)),
        "the slow client was served"
    );
    // A body that trickles: its header arrives, its body never does.
    let mut trickle = UnixStream::connect(&path).unwrap();
    trickle
        .write_all(b"PUT /api/v1/sched.credit HTTP/1.1\r\nhost: k\r\ncontent-length: 20\r\n\r\n{")
        .unwrap();
    let mut response = String::new();
    trickle
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = trickle.read(&mut buf).unwrap();
    response.push_str(&String::from_utf8_lossy(&buf[..n]));
    assert_eq!(status_of(&response), 408, "{response}");
    assert_eq!(get(&path, "/api/v1/vm.info").status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_that_never_reads_is_dropped_at_its_deadline() {
    let dir = scratch("noread");
    let path = dir.join("api.sock");
    let _server = Server::start_with(&path, fake(), || (), short()).unwrap();
    let mut mute = UnixStream::connect(&path).unwrap();
    mute.set_write_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    // Pipelined requests whose answers fill the socket's buffers unread.
    let request = b"GET /api/v1/sched.credit HTTP/1.1\r\nhost: k\r\n\r\n";
    for _ in 0..20_000 {
        if mute.write_all(request).is_err() {
            break;
        }
    }
    // The server answers others meanwhile...
    assert_eq!(get(&path, "/api/v1/vm.info").status, 200);
    // ...and closes this one at its deadline (well within the bound).
    assert!(closed_within(&mut mute, Duration::from_secs(60)));
    assert_eq!(get(&path, "/api/v1/vm.info").status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn clients_beyond_the_limit_get_503_and_the_rest_are_served() {
    let dir = scratch("many");
    let path = dir.join("api.sock");
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let _server = Server::start_with(&path, fake(), || (), limits).unwrap();
    // Four idle connections fill the slots (each answered once, so each is served).
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"GET /api/v1/vm.info HTTP/1.1\r\nhost: k\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        assert_eq!(status_of(&String::from_utf8_lossy(&buf[..n])), 200);
        held.push(s);
    }
    let response = raw(
        &path,
        b"GET /api/v1/vm.info HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&response), 503, "{response}");
    assert!(response.contains("too many API clients"), "{response}");
    drop(held);
    // Slots come back as clients leave.
    let mut served = false;
    for _ in 0..1000 {
        let reply = get(&path, "/api/v1/vm.info");
        if reply.status == 200 {
            served = true;
            break;
        }
        assert_eq!(reply.status, 503);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(served);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_server_that_never_replies_is_named() {
    let dir = scratch("mute");
    let path = dir.join("mute.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
    let err = client::request(
        &path,
        "GET",
        "/api/v1/vm.info",
        None,
        Some(Duration::from_millis(200)),
    )
    .unwrap_err();
    let text = crate::output::error_chain(&err);
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("no reply within 0.2 s"), "{text}");
    drop(held.join());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_answer_is_json_with_one_message() {
    let a = Answer::refused(Refused::conflict("busy"));
    assert_eq!(a.status, 409);
    assert_eq!(a.body, br#"{"error":"busy"}"#);
}

/// The OpenAPI document lists exactly the routes the server answers.
#[test]
fn the_openapi_document_matches_the_routes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.openapi.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = std::collections::BTreeSet::new();
    for (route, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                documented.insert((method.to_uppercase(), route.clone()));
            }
        }
    }
    assert_eq!(documented, routes::route_set());
}
