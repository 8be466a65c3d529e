//! The structured lines kumo's own guest prints on its console (`docs/guest-abi.md`):
//! `@kumo <event> key=value ...`. The guest controls these bytes, so parsing is total:
//! anything malformed becomes `Event::Malformed`, never a panic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

const PREFIX: &str = "@kumo ";

/// Steps of a kernel's timed loop: `done` of `of`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steps {
    pub done: u32,
    pub of: u32,
}

/// One benchmark's outcome as the guest reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchResult {
    pub benchmark: String,
    pub class: String,
    pub threads: u32,
    pub time_s: f64,
    pub mops: f64,
    pub verified: bool,
    /// Every other key the guest printed (checksums and the like), kept for `--json`.
    pub extra: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Boot {
        cpus: u32,
        tsc_khz: u64,
    },
    Result(BenchResult),
    Error {
        fields: BTreeMap<String, String>,
    },
    Fault {
        fields: BTreeMap<String, String>,
    },
    End {
        status: u32,
    },
    /// An MPI kernel's timed loop finished step `done` of `of` (`done <= of`).
    Progress(Steps),
    /// A measurement workload's summary (`switchprobe`, `wakeprobe`, `irqbench`,
    /// `irqcheck`, and the network's `mpi`, `netcheck`, `pingpong`, `bandwidth`,
    /// `mpistats`, and the guest scheduler's `sched`).
    Measurement {
        kind: String,
        fields: BTreeMap<String, String>,
    },
    /// An `@kumo` line that does not parse; kept so it can be reported.
    Malformed(String),
}

/// A guest field's value as JSON: a number if it reads as one (an integer stays one;
/// every `--json` prints numbers as JSON numbers), null for NaN and infinities,
/// `true`/`false` as booleans, else the text.
pub fn field_json(key: &str, text: &str) -> serde_json::Value {
    if TEXT_FIELDS.contains(&key) {
        return serde_json::Value::String(text.to_owned());
    }
    if let Ok(n) = text.parse::<i64>() {
        return n.into();
    }
    if let Ok(n) = text.parse::<u64>() {
        return n.into();
    }
    match (text.parse::<f64>(), text) {
        (Ok(n), _) if n.is_finite() => serde_json::Value::from(n),
        // A measurement the guest could not take ("nan", "inf") is missing: null.
        (Ok(_), _) => serde_json::Value::Null,
        (_, "true") => serde_json::Value::Bool(true),
        (_, "false") => serde_json::Value::Bool(false),
        _ => serde_json::Value::String(text.to_owned()),
    }
}

/// Fields whose values are digits that are not numbers: a hash in hex may happen to
/// contain no letter, and must not then turn into a number.
const TEXT_FIELDS: &[&str] = &["fnv"];

/// Field `key` of the guest's `fields` as a finite number, or None.
pub fn f64_field(fields: &BTreeMap<String, String>, key: &str) -> Option<f64> {
    fields
        .get(key)?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

/// Field `key` of the guest's `fields` as a count, or None.
pub fn u64_field(fields: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    fields.get(key)?.parse().ok()
}

/// The guest's fields as a JSON object (see [`field_json`]).
pub fn fields_json(
    fields: &BTreeMap<String, String>,
) -> serde_json::Map<String, serde_json::Value> {
    fields
        .iter()
        .map(|(k, v)| (k.clone(), field_json(k, v)))
        .collect()
}

/// The fields of one of the guest's `@kumo` lines as JSON values (each through
/// [`field_json`]): an object of its keys, in their alphabetical order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GuestFields(pub BTreeMap<String, serde_json::Value>);

impl GuestFields {
    pub fn of(fields: &BTreeMap<String, String>) -> GuestFields {
        GuestFields(fields_json(fields).into_iter().collect())
    }

    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.0.get(key)
    }
}

/// A JSON row of kumo's own fields (`T`, a struct, first, in its declaration order)
/// and the guest's (after them): where both have a key, kumo's wins and the guest's is
/// left out, so no key appears twice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WithGuest<T> {
    #[serde(flatten)]
    pub kumo: T,
    #[serde(flatten)]
    pub guest: GuestFields,
}

impl<T: Serialize> WithGuest<T> {
    pub fn new(kumo: T, mut guest: GuestFields) -> WithGuest<T> {
        if let Ok(serde_json::Value::Object(own)) = serde_json::to_value(&kumo) {
            guest.0.retain(|k, _| !own.contains_key(k));
        }
        WithGuest { kumo, guest }
    }
}

/// Which `@kumo` measurement line a row holds (`irqbench`, `wakeprobe`, ...): kumo's
/// field of a measurement's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    pub probe: String,
}

/// `{"ok": bool}`: the last line of `kumo mpi --json` and of an NPB-MPI job's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OkLine {
    pub ok: bool,
}

/// How many benchmark results (`@kumo result`, verified or not) a console holds: a
/// running guest's progress through its `npb=` list.
pub fn count_results(console: &[u8]) -> u32 {
    let results = console
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"@kumo result "))
        .filter(|line| {
            matches!(
                parse_line(&String::from_utf8_lossy(line)),
                Some(Event::Result(_))
            )
        })
        .count();
    u32::try_from(results).unwrap_or(u32::MAX)
}

/// Parses one console line; `None` if it is ordinary guest text.
pub fn parse_line(line: &str) -> Option<Event> {
    let rest = line.trim_end_matches(['\r', '\n']).strip_prefix(PREFIX)?;
    let mut words = rest.split_ascii_whitespace();
    let kind = words.next().unwrap_or("");
    let mut fields = BTreeMap::new();
    for word in words {
        match word.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                fields.insert(k.to_string(), v.to_string());
            }
            _ => return Some(Event::Malformed(line.to_string())),
        }
    }
    let event = match kind {
        "boot" => parse_boot(&fields),
        "result" => parse_result(fields),
        "error" => Some(Event::Error { fields }),
        "fault" => Some(Event::Fault { fields }),
        "end" => num(&fields, "status").map(|status| Event::End { status }),
        "progress" => parse_progress(&fields),
        "switchprobe" | "wakeprobe" | "gapprobe" | "irqbench" | "irqcheck" | "mpi" | "netcheck"
        | "pingpong" | "bandwidth" | "mpistats" | "barrierstats" | "sched" => {
            Some(Event::Measurement {
                kind: kind.to_string(),
                fields,
            })
        }
        _ => None,
    };
    Some(event.unwrap_or_else(|| Event::Malformed(line.to_string())))
}

fn num<T: std::str::FromStr>(fields: &BTreeMap<String, String>, key: &str) -> Option<T> {
    fields.get(key)?.parse().ok()
}

fn parse_progress(fields: &BTreeMap<String, String>) -> Option<Event> {
    let steps = Steps {
        done: num(fields, "done")?,
        of: num(fields, "of")?,
    };
    (steps.of > 0 && steps.done <= steps.of).then_some(Event::Progress(steps))
}

/// The last progress line a console holds (an MPI kernel's steps so far).
pub fn last_steps(console: &[u8]) -> Option<Steps> {
    console
        .rsplit(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"@kumo progress "))
        .find_map(|line| match parse_line(&String::from_utf8_lossy(line)) {
            Some(Event::Progress(steps)) => Some(steps),
            _ => None,
        })
}

fn parse_boot(fields: &BTreeMap<String, String>) -> Option<Event> {
    Some(Event::Boot {
        cpus: num(fields, "cpus")?,
        tsc_khz: num(fields, "tsc_khz")?,
    })
}

fn parse_result(mut fields: BTreeMap<String, String>) -> Option<Event> {
    let time_s: f64 = num(&fields, "time_s")?;
    let mops: f64 = num(&fields, "mops")?;
    if !time_s.is_finite() || !mops.is_finite() {
        return None;
    }
    let verified = match fields.get("verified")?.as_str() {
        "true" => true,
        "false" => false,
        _ => return None,
    };
    let threads = num(&fields, "threads")?;
    let benchmark = fields.remove("benchmark")?;
    let class = fields.remove("class")?;
    for key in ["time_s", "mops", "verified", "threads"] {
        fields.remove(key);
    }
    Some(Event::Result(BenchResult {
        benchmark,
        class,
        threads,
        time_s,
        mops,
        verified,
        extra: fields,
    }))
}

/// Splits a byte stream into lines and parses them. Ordinary text lines are handed to
/// `on_text`, so a caller can echo the guest's own messages.
#[derive(Default)]
pub struct LineParser {
    partial: Vec<u8>,
}

/// A guest that never prints a newline must not make kumo buffer without bound.
const MAX_LINE: usize = 64 * 1024;

impl LineParser {
    pub fn feed(&mut self, bytes: &[u8], mut on_line: impl FnMut(&str, Option<Event>)) {
        for &b in bytes {
            if b == b'\n' || self.partial.len() >= MAX_LINE {
                let text = String::from_utf8_lossy(&self.partial);
                let text = text.trim_end_matches('\r');
                on_line(text, parse_line(text));
                self.partial.clear();
                if b == b'\n' {
                    continue;
                }
            }
            self.partial.push(b);
        }
    }

    /// Whatever remains after the guest stopped (a last line without a newline).
    pub fn finish(&mut self, mut on_line: impl FnMut(&str, Option<Event>)) {
        if !self.partial.is_empty() {
            let text = String::from_utf8_lossy(&self.partial).into_owned();
            on_line(&text, parse_line(&text));
            self.partial.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_fields_read_numbers_and_counts() {
        let fields: BTreeMap<String, String> = [("n", "1995"), ("us", "52.00"), ("x", "nan")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(u64_field(&fields, "n"), Some(1995));
        assert_eq!(f64_field(&fields, "us"), Some(52.0));
        assert_eq!(f64_field(&fields, "x"), None);
        assert_eq!(u64_field(&fields, "us"), None);
        assert_eq!(f64_field(&fields, "missing"), None);
    }

    #[test]
    fn kumo_fields_win_over_the_guests_and_come_first() {
        #[derive(Serialize)]
        struct Own {
            rank: u32,
            verified: bool,
        }
        let fields: BTreeMap<String, String> =
            [("verified", "maybe"), ("bytes", "12"), ("fnv", "0123")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let row = WithGuest::new(
            Own {
                rank: 1,
                verified: true,
            },
            GuestFields::of(&fields),
        );
        assert_eq!(
            serde_json::to_string(&row).unwrap(),
            r#"{"rank":1,"verified":true,"bytes":12,"fnv":"0123"}"#
        );
    }

    #[test]
    fn guest_fields_become_json_numbers_and_booleans() {
        assert_eq!(field_json("x", "42"), serde_json::json!(42));
        assert_eq!(field_json("x", "-3"), serde_json::json!(-3));
        assert_eq!(field_json("x", "45.55"), serde_json::json!(45.55));
        assert_eq!(
            field_json("x", "18446744073709551615"),
            serde_json::json!(u64::MAX)
        );
        assert_eq!(field_json("x", "true"), serde_json::json!(true));
        assert_eq!(field_json("x", "nan"), serde_json::Value::Null);
        assert_eq!(field_json("x", "-inf"), serde_json::Value::Null);
        assert_eq!(field_json("x", "0x10"), serde_json::json!("0x10"));
        assert_eq!(field_json("x", "cg.A"), serde_json::json!("cg.A"));
        assert_eq!(
            field_json("fnv", "1234567890123456"),
            serde_json::json!("1234567890123456")
        );
    }

    #[test]
    fn parses_a_result_line_with_extra_fields() {
        let line = "@kumo result benchmark=ep class=S threads=2 time_s=0.812345 mops=41.31 \
                    verified=true sx=-3.247834652034740e3 sy=-6.958407078382297e3";
        let Some(Event::Result(r)) = parse_line(line) else {
            panic!("not a result: {:?}", parse_line(line));
        };
        assert_eq!(r.benchmark, "ep");
        assert_eq!(r.class, "S");
        assert_eq!(r.threads, 2);
        assert_eq!(r.time_s, 0.812345);
        assert_eq!(r.mops, 41.31);
        assert!(r.verified);
        assert_eq!(r.extra.get("sx").unwrap(), "-3.247834652034740e3");
        assert_eq!(r.extra.len(), 2);
    }

    #[test]
    fn parses_boot_and_end() {
        assert_eq!(
            parse_line("@kumo boot cpus=4 tsc_khz=2995200\r"),
            Some(Event::Boot {
                cpus: 4,
                tsc_khz: 2995200
            })
        );
        assert_eq!(
            parse_line("@kumo end status=1"),
            Some(Event::End { status: 1 })
        );
    }

    #[test]
    fn ordinary_text_is_not_an_event() {
        assert_eq!(parse_line("hello from the guest"), None);
        assert_eq!(parse_line("@kumoboot cpus=1"), None);
    }

    #[test]
    fn progress_lines_parse_and_the_last_one_counts() {
        assert_eq!(
            parse_line("@kumo progress done=3 of=20\r"),
            Some(Event::Progress(Steps { done: 3, of: 20 }))
        );
        for bad in [
            "@kumo progress done=21 of=20",
            "@kumo progress done=1 of=0",
            "@kumo progress done=x of=2",
            "@kumo progress of=2",
        ] {
            assert!(
                matches!(parse_line(bad), Some(Event::Malformed(_))),
                "{bad}"
            );
        }
        let console = b"@kumo progress done=1 of=4\n@kumo progress done=2 of=4\n\
                        @kumo progress done=9 of=4\ntext\n";
        assert_eq!(last_steps(console), Some(Steps { done: 2, of: 4 }));
        assert_eq!(last_steps(b"nothing\n"), None);
    }

    #[test]
    fn results_are_counted_only_when_they_parse() {
        let good = "@kumo result benchmark=ep class=S threads=1 time_s=0.5 mops=1 verified=true";
        let failed = "@kumo result benchmark=cg class=S threads=1 time_s=0.5 mops=1 verified=false";
        let console = format!(
            "booting\n@kumo boot cpus=1 tsc_khz=1\n{good}\r\n{failed}\n\
             @kumo result class=S time_s=1\n{good}"
        );
        // The malformed line (no benchmark) is not progress; an unverified one is.
        assert_eq!(count_results(console.as_bytes()), 3);
        assert_eq!(count_results(b""), 0);
        assert_eq!(count_results(&[0xff, b'\n', 0xfe]), 0);
    }

    #[test]
    fn malformed_structured_lines_are_reported_not_trusted() {
        for line in [
            "@kumo result benchmark=ep class=S threads=2 time_s=abc mops=1 verified=true",
            "@kumo result benchmark=ep class=S threads=2 time_s=NaN mops=1 verified=true",
            "@kumo result benchmark=ep class=S threads=2 time_s=1 mops=1 verified=maybe",
            "@kumo result class=S threads=2 time_s=1 mops=1 verified=true",
            "@kumo end status=-1",
            "@kumo boot cpus",
            "@kumo frobnicate a=b",
        ] {
            assert!(
                matches!(parse_line(line), Some(Event::Malformed(_))),
                "{line}"
            );
        }
    }

    #[test]
    fn line_parser_reassembles_split_lines_and_bounds_long_ones() {
        let mut parser = LineParser::default();
        let mut seen = Vec::new();
        parser.feed(b"abc\n@kumo end sta", |t, e| seen.push((t.to_string(), e)));
        parser.feed(b"tus=0\r\ntail", |t, e| seen.push((t.to_string(), e)));
        parser.finish(|t, e| seen.push((t.to_string(), e)));
        assert_eq!(
            seen,
            vec![
                ("abc".to_string(), None),
                (
                    "@kumo end status=0".to_string(),
                    Some(Event::End { status: 0 })
                ),
                ("tail".to_string(), None),
            ]
        );

        let mut count = 0;
        parser.feed(&vec![b'x'; MAX_LINE * 2 + 1], |_, _| count += 1);
        assert_eq!(count, 2);
    }
}
