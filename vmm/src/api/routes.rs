//! The API's routes: which method and path mean which request, its JSON body parsed
//! (unknown fields refused), and the answers that need no thread of their own. No
//! HTTP machinery here, so every route's answer is testable as plain data.

use std::collections::BTreeSet;

use serde::Serialize;

use super::{Controlled, Refusal, Refused};
use crate::spec::control::{
    ApiError, BalloonRequest, DomainList, DomainUpdate, MigrateRequest, SchedUpdate,
    SnapshotRequest,
};

/// Where every route lives.
pub const PREFIX: &str = "/api/v1/";

/// Every route the server answers, as the OpenAPI document (`docs/api.openapi.json`)
/// must list them: method and path template.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v1/vm.info"),
    ("GET", "/api/v1/vm.counters"),
    ("PUT", "/api/v1/vm.pause"),
    ("PUT", "/api/v1/vm.resume"),
    ("PUT", "/api/v1/vm.snapshot"),
    ("PUT", "/api/v1/vm.migrate"),
    ("GET", "/api/v1/vm.migrate/{id}"),
    ("GET", "/api/v1/vm.balloon"),
    ("PUT", "/api/v1/vm.balloon"),
    ("GET", "/api/v1/sched.credit"),
    ("PUT", "/api/v1/sched.credit"),
    ("GET", "/api/v1/domains"),
    ("GET", "/api/v1/domains/{name}"),
    ("PUT", "/api/v1/domains/{name}"),
];

/// One request, understood.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Info,
    Counters,
    Pause,
    Resume,
    Snapshot(SnapshotRequest),
    Migrate(MigrateRequest),
    Progress(u64),
    BalloonShow(Option<String>),
    BalloonSet(BalloonRequest),
    SchedShow,
    SchedSet(SchedUpdate),
    DomainList,
    DomainShow(String),
    DomainSet(String, DomainUpdate),
}

/// A reply: status, JSON body, and the headers some statuses need.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    /// 405's `Allow`.
    pub allow: Option<String>,
    /// 202's `Location`.
    pub location: Option<String>,
}

impl Answer {
    pub fn json(status: u16, value: &impl Serialize) -> Answer {
        Answer {
            status,
            // Serializing our own plain types cannot fail; an empty object if it did.
            body: serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()),
            allow: None,
            location: None,
        }
    }

    pub fn error(status: u16, message: impl Into<String>) -> Answer {
        Answer::json(
            status,
            &ApiError {
                error: message.into(),
            },
        )
    }

    pub fn refused(refused: Refused) -> Answer {
        let status = match refused.kind {
            Refusal::BadValue => 400,
            Refusal::NotFound => 404,
            Refusal::Conflict => 409,
            Refusal::Failed => 500,
        };
        Answer::error(status, refused.message)
    }

    pub fn of<T: Serialize>(result: Result<T, Refused>) -> Answer {
        match result {
            Ok(value) => Answer::json(200, &value),
            Err(refused) => Answer::refused(refused),
        }
    }
}

/// A matched route, before its body is read.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    template: &'static str,
    put: bool,
    /// `{name}` or `{id}`, decoded.
    parameter: Option<String>,
    /// `?domain=` of `GET vm.balloon`.
    domain: Option<String>,
}

impl Matched {
    /// Whether this route reads a body.
    pub fn takes_body(&self) -> bool {
        self.put
    }
}

/// Matches `method` and `path` (with `query`) to a route: 404 for no such path, 405
/// (with `Allow`) for a path that has no such method, 400 for a bad query.
pub fn resolve(method: &str, path: &str, query: Option<&str>) -> Result<Matched, Answer> {
    let (template, parameter) =
        template_of(path).ok_or_else(|| Answer::error(404, format!("no such resource: {path}")))?;
    let allowed: Vec<&str> = ROUTES
        .iter()
        .filter(|(_, t)| *t == template)
        .map(|(m, _)| *m)
        .collect();
    if !allowed.contains(&method) {
        let mut answer = Answer::error(
            405,
            format!(
                "{method} is not allowed on {path} (use {})",
                allowed.join(", ")
            ),
        );
        answer.allow = Some(allowed.join(", "));
        return Err(answer);
    }
    let domain = match query.filter(|q| !q.is_empty()) {
        None => None,
        Some(q) if template == "/api/v1/vm.balloon" && method == "GET" => {
            Some(query_domain(q).map_err(|e| Answer::error(400, e))?)
        }
        Some(q) => return Err(Answer::error(400, format!("{path} takes no query ({q})"))),
    };
    Ok(Matched {
        template,
        put: method == "PUT",
        parameter,
        domain,
    })
}

/// The route template `path` falls under, and its path parameter.
fn template_of(path: &str) -> Option<(&'static str, Option<String>)> {
    let rest = path.strip_prefix(PREFIX)?;
    if let Some(id) = rest.strip_prefix("vm.migrate/") {
        return Some(("/api/v1/vm.migrate/{id}", Some(id.to_string())));
    }
    if let Some(name) = rest.strip_prefix("domains/") {
        return Some(("/api/v1/domains/{name}", Some(name.to_string())));
    }
    ROUTES
        .iter()
        .map(|(_, t)| *t)
        .find(|t| t.strip_prefix(PREFIX) == Some(rest) && !t.contains('{'))
        .map(|t| (t, None))
}

/// `domain=NAME`, the one query `GET vm.balloon` takes.
fn query_domain(query: &str) -> Result<String, String> {
    match query.split_once('=') {
        Some(("domain", value)) if !value.contains('&') => decode(value),
        _ => Err(format!(
            "bad query '{query}': GET vm.balloon takes only domain=NAME"
        )),
    }
}

/// Percent-decodes a path segment or query value.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in '{text}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{text}' is not UTF-8 once decoded"))
}

/// The request `matched` and its `body` make: 400 for a body that is not the
/// route's JSON (malformed, unknown or missing fields), or a body where none belongs.
pub fn parse(matched: &Matched, body: &[u8]) -> Result<Call, Answer> {
    fn json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Answer> {
        let bad = |e: serde_json::Error| Answer::error(400, format!("bad request body: {e}"));
        let value: serde_json::Value = serde_json::from_slice(body).map_err(bad)?;
        // serde would take an array for a struct's fields in order: only objects here.
        if !value.is_object() {
            return Err(Answer::error(400, "bad request body: not a JSON object"));
        }
        serde_json::from_value(value).map_err(bad)
    }
    let name = || -> Result<String, Answer> {
        let raw = matched.parameter.as_deref().unwrap_or_default();
        let name = decode(raw).map_err(|e| Answer::error(400, e))?;
        if name.is_empty() || name.contains('/') {
            return Err(Answer::error(
                404,
                format!("no such resource: domains/{raw}"),
            ));
        }
        Ok(name)
    };
    if !matched.put && !body.is_empty() {
        return Err(Answer::error(400, "a GET takes no body"));
    }
    Ok(match (matched.template, matched.put) {
        ("/api/v1/vm.info", _) => Call::Info,
        ("/api/v1/vm.counters", _) => Call::Counters,
        ("/api/v1/vm.pause", _) => {
            empty_body(body)?;
            Call::Pause
        }
        ("/api/v1/vm.resume", _) => {
            empty_body(body)?;
            Call::Resume
        }
        ("/api/v1/vm.snapshot", _) => Call::Snapshot(json(body)?),
        ("/api/v1/vm.migrate", _) => Call::Migrate(json(body)?),
        ("/api/v1/vm.migrate/{id}", _) => {
            let raw = matched.parameter.as_deref().unwrap_or_default();
            let id = raw
                .parse()
                .map_err(|_| Answer::error(404, format!("no migration '{raw}'")))?;
            Call::Progress(id)
        }
        ("/api/v1/vm.balloon", false) => Call::BalloonShow(matched.domain.clone()),
        ("/api/v1/vm.balloon", true) => Call::BalloonSet(json(body)?),
        ("/api/v1/sched.credit", false) => Call::SchedShow,
        ("/api/v1/sched.credit", true) => Call::SchedSet(json(body)?),
        ("/api/v1/domains", _) => Call::DomainList,
        ("/api/v1/domains/{name}", false) => Call::DomainShow(name()?),
        ("/api/v1/domains/{name}", true) => {
            let update: DomainUpdate = json(body)?;
            if update.weight.is_none() && update.cap.is_none() {
                return Err(Answer::error(400, "give weight and/or cap"));
            }
            Call::DomainSet(name()?, update)
        }
        (template, _) => return Err(Answer::error(404, format!("no such resource: {template}"))),
    })
}

/// `vm.pause` and `vm.resume` take no parameters: nothing, or `{}`.
fn empty_body(body: &[u8]) -> Result<(), Answer> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Nothing {}
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Answer::error(400, format!("bad request body: {e}")))?;
    if !value.is_object() {
        return Err(Answer::error(400, "bad request body: not a JSON object"));
    }
    serde_json::from_value::<Nothing>(value)
        .map(drop)
        .map_err(|e| Answer::error(400, format!("bad request body: {e}")))
}

/// Answers a request that runs on the API thread (everything but snapshot,
/// migrate and progress, which `super::jobs` answers).
pub fn answer(target: &dyn Controlled, call: Call) -> Answer {
    match call {
        Call::Info => Answer::json(200, &target.info()),
        Call::Counters => Answer::json(200, &target.counters()),
        Call::Pause => Answer::of(target.pause()),
        Call::Resume => Answer::of(target.resume()),
        Call::BalloonShow(domain) => Answer::of(target.vcpu_balloon(domain.as_deref(), None)),
        Call::BalloonSet(b) => Answer::of(target.vcpu_balloon(b.domain.as_deref(), Some(b.active))),
        Call::SchedShow => Answer::json(200, &target.sched_params()),
        Call::SchedSet(update) => Answer::of(target.set_sched_params(update)),
        Call::DomainList => Answer::json(
            200,
            &DomainList {
                domains: target.domains(),
            },
        ),
        Call::DomainShow(name) => Answer::of(
            target
                .domains()
                .into_iter()
                .find(|d| d.domain == name)
                .ok_or_else(|| Refused::not_found(format!("no domain '{name}'"))),
        ),
        Call::DomainSet(name, update) => {
            if !target.domains().iter().any(|d| d.domain == name) {
                return Answer::refused(Refused::not_found(format!("no domain '{name}'")));
            }
            Answer::of(target.set_domain(&name, update.weight, update.cap))
        }
        Call::Snapshot(_) | Call::Migrate(_) | Call::Progress(_) => {
            Answer::error(500, "this request runs off the API thread")
        }
    }
}

/// The set of (method, template) pairs, for comparing with the OpenAPI document.
pub fn route_set() -> BTreeSet<(String, String)> {
    ROUTES
        .iter()
        .map(|(m, t)| (m.to_string(), t.to_string()))
        .collect()
}
