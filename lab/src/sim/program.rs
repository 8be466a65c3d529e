//! What a rank does: its phase list, as written in the file (`"compute:4"`,
//! `"exchange:pairs:56000"`, ...) and as the model runs it (compute, send, receive,
//! dom0 I/O, sleep). Collectives are written once for every rank and expanded per
//! rank into point-to-point sends and receives, so the model only knows messages.
//!
//! Grammar (numbers may be decimals where they are times):
//!
//! | phase | meaning |
//! |---|---|
//! | `compute:MS` | run MS milliseconds of the rank's own CPU work |
//! | `send:R:BYTES` | hand BYTES to rank R (eager: the sender goes on at once) |
//! | `recv:R` | wait for the next message from rank R |
//! | `io:US` | ask domain 0 for US microseconds of work and wait for it |
//! | `sleep:MS` | block (halt) for MS milliseconds |
//! | `exchange:PATTERN:BYTES` | send to, then receive from, the pattern's peers |
//! | `allreduce:BYTES` | ⌈log2 n⌉ rounds: send to rank r+2^k, receive from r-2^k |
//! | `barrier` | `allreduce:0` |
//!
//! R is a rank number (`3`) or an offset from the rank running the phase (`+1`,
//! `-2`, modulo the number of ranks), so one list serves every rank. Patterns:
//! `ring` (send to r+1, receive from r-1), `pairs` (exchange with r+n/2, the rank
//! at the same place in the other half of the cluster: across nodes when ranks are
//! numbered node by node), `alltoall` (every other rank, pairwise-exchange order).
//! The allreduce is a dissemination pattern (valid for any n; the same messages as
//! recursive doubling when n is a power of two).

use std::fmt;

/// Largest message accepted (1 GiB).
pub const MAX_BYTES: u64 = 1 << 30;
/// Longest single compute or sleep phase (one hour).
const MAX_MS: f64 = 3_600_000.0;

/// One step of a rank, as the model runs it. Times in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Compute(u64),
    Send { to: u32, bytes: u64 },
    Recv { from: u32 },
    Io(u64),
    Sleep(u64),
}

/// A peer as written: absolute or relative to the running rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Rank(u32),
    Offset(i64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    Ring,
    Pairs,
    Alltoall,
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "ring" => Ok(Pattern::Ring),
            "pairs" => Ok(Pattern::Pairs),
            "alltoall" => Ok(Pattern::Alltoall),
            _ => Err(format!(
                "pattern '{text}' is unknown (known: ring, pairs, alltoall)"
            )),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pattern::Ring => "ring",
            Pattern::Pairs => "pairs",
            Pattern::Alltoall => "alltoall",
        })
    }
}

/// One item of a phase list as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Compute(u64),
    Send { peer: Peer, bytes: u64 },
    Recv { peer: Peer },
    Io(u64),
    Sleep(u64),
    Exchange { pattern: Pattern, bytes: u64 },
    Allreduce { bytes: u64 },
}

fn millis(what: &str, text: &str) -> Result<u64, String> {
    match text.parse::<f64>() {
        Ok(ms) if ms.is_finite() && (0.0..=MAX_MS).contains(&ms) => Ok((ms * 1e6).round() as u64),
        _ => Err(format!(
            "{what} '{text}' must be a number of milliseconds in 0..={MAX_MS}"
        )),
    }
}

fn micros(what: &str, text: &str) -> Result<u64, String> {
    match text.parse::<f64>() {
        Ok(us) if us.is_finite() && (0.0..=MAX_MS * 1e3).contains(&us) => {
            Ok((us * 1e3).round() as u64)
        }
        _ => Err(format!(
            "{what} '{text}' must be a number of microseconds in 0..={}",
            MAX_MS * 1e3
        )),
    }
}

fn bytes(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(b) if b <= MAX_BYTES => Ok(b),
        _ => Err(format!(
            "message size '{text}' must be a whole number of bytes in 0..={MAX_BYTES}"
        )),
    }
}

fn peer(text: &str) -> Result<Peer, String> {
    let bad = || format!("rank '{text}' must be a rank number or an offset like +1 or -1");
    if let Some(rest) = text.strip_prefix('+') {
        rest.parse::<i64>().map(Peer::Offset).map_err(|_| bad())
    } else if text.starts_with('-') {
        text.parse::<i64>().map(Peer::Offset).map_err(|_| bad())
    } else {
        text.parse::<u32>().map(Peer::Rank).map_err(|_| bad())
    }
}

/// Parses one phase of a list; the error says what is wrong with it.
pub fn parse_step(text: &str) -> Result<Step, String> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let step = match parts.as_slice() {
        ["compute", ms] => Step::Compute(millis("compute time", ms)?),
        ["send", r, b] => Step::Send {
            peer: peer(r)?,
            bytes: bytes(b)?,
        },
        ["recv", r] => Step::Recv { peer: peer(r)? },
        ["io", us] => Step::Io(micros("io time", us)?),
        ["sleep", ms] => Step::Sleep(millis("sleep time", ms)?),
        ["exchange", p, b] => Step::Exchange {
            pattern: Pattern::parse(p)?,
            bytes: bytes(b)?,
        },
        ["allreduce", b] => Step::Allreduce { bytes: bytes(b)? },
        ["barrier"] => Step::Allreduce { bytes: 0 },
        _ => {
            return Err(
                "not a phase (compute:MS, send:RANK:BYTES, recv:RANK, io:US, \
                 sleep:MS, exchange:ring|pairs|alltoall:BYTES, allreduce:BYTES, barrier)"
                    .into(),
            );
        }
    };
    Ok(step)
}

fn resolve(peer: Peer, rank: u32, ranks: u32) -> Result<u32, String> {
    let to = match peer {
        Peer::Rank(r) if r < ranks => r,
        Peer::Rank(r) => {
            return Err(format!(
                "rank {r} is out of range (ranks are 0..={})",
                ranks - 1
            ));
        }
        Peer::Offset(k) => (i64::from(rank) + k).rem_euclid(i64::from(ranks)) as u32,
    };
    if to == rank {
        return Err(format!("rank {rank} would send to or receive from itself"));
    }
    Ok(to)
}

/// The phases `steps` mean for `rank` of `ranks`.
pub fn expand(steps: &[Step], rank: u32, ranks: u32) -> Result<Vec<Phase>, String> {
    let n = ranks;
    let at = |k: u32| (rank + k) % n;
    let back = |k: u32| (rank + n - k % n) % n;
    let mut out = Vec::new();
    for step in steps {
        match *step {
            Step::Compute(ns) => out.push(Phase::Compute(ns)),
            Step::Io(ns) => out.push(Phase::Io(ns)),
            Step::Sleep(ns) => out.push(Phase::Sleep(ns)),
            Step::Send { peer, bytes } => out.push(Phase::Send {
                to: resolve(peer, rank, n)?,
                bytes,
            }),
            Step::Recv { peer } => out.push(Phase::Recv {
                from: resolve(peer, rank, n)?,
            }),
            Step::Exchange { pattern, bytes } => {
                let peers: Vec<(u32, u32)> = match pattern {
                    Pattern::Ring if n > 1 => vec![(at(1), back(1))],
                    Pattern::Ring => Vec::new(),
                    Pattern::Pairs if n.is_multiple_of(2) => vec![(at(n / 2), at(n / 2))],
                    Pattern::Pairs => {
                        return Err(format!(
                            "exchange:pairs needs an even number of ranks (there are {n})"
                        ));
                    }
                    Pattern::Alltoall => (1..n).map(|k| (at(k), back(k))).collect(),
                };
                for &(to, _) in &peers {
                    out.push(Phase::Send { to, bytes });
                }
                for &(_, from) in &peers {
                    out.push(Phase::Recv { from });
                }
            }
            Step::Allreduce { bytes } => {
                let mut k = 1;
                while k < n {
                    out.push(Phase::Send { to: at(k), bytes });
                    out.push(Phase::Recv { from: back(k) });
                    k *= 2;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(list: &[&str], rank: u32, ranks: u32) -> Result<Vec<Phase>, String> {
        let steps: Vec<Step> = list
            .iter()
            .map(|s| parse_step(s))
            .collect::<Result<_, _>>()?;
        expand(&steps, rank, ranks)
    }

    #[test]
    fn phases_parse_with_their_units() {
        assert_eq!(parse_step("compute:2.5"), Ok(Step::Compute(2_500_000)));
        assert_eq!(parse_step(" io:40 "), Ok(Step::Io(40_000)));
        assert_eq!(parse_step("sleep:0"), Ok(Step::Sleep(0)));
        assert_eq!(
            parse_step("send:+1:8"),
            Ok(Step::Send {
                peer: Peer::Offset(1),
                bytes: 8
            })
        );
        assert_eq!(
            parse_step("recv:-1"),
            Ok(Step::Recv {
                peer: Peer::Offset(-1)
            })
        );
        assert_eq!(parse_step("barrier"), Ok(Step::Allreduce { bytes: 0 }));
        assert!(
            parse_step("compute:-1")
                .unwrap_err()
                .contains("milliseconds")
        );
        assert!(parse_step("compute:nan").is_err());
        assert!(
            parse_step("send:1:1.5")
                .unwrap_err()
                .contains("whole number")
        );
        assert!(parse_step("recv:x").unwrap_err().contains("offset like +1"));
        assert!(
            parse_step("exchange:star:8")
                .unwrap_err()
                .contains("known: ring")
        );
        assert!(parse_step("spin:3").unwrap_err().contains("not a phase"));
    }

    #[test]
    fn collectives_expand_to_matching_sends_and_receives() {
        assert_eq!(
            phases(&["exchange:ring:10"], 0, 4).unwrap(),
            vec![Phase::Send { to: 1, bytes: 10 }, Phase::Recv { from: 3 }]
        );
        assert_eq!(
            phases(&["exchange:pairs:10"], 1, 4).unwrap(),
            vec![Phase::Send { to: 3, bytes: 10 }, Phase::Recv { from: 3 }]
        );
        assert_eq!(
            phases(&["allreduce:8"], 3, 4).unwrap(),
            vec![
                Phase::Send { to: 0, bytes: 8 },
                Phase::Recv { from: 2 },
                Phase::Send { to: 1, bytes: 8 },
                Phase::Recv { from: 1 },
            ]
        );
        // Every message sent is received, for every pattern and size of cluster.
        for n in 2..=7u32 {
            for list in [
                &["exchange:ring:1"][..],
                &["exchange:alltoall:1"],
                &["allreduce:1"],
                &["send:+1:1", "recv:-1"],
            ] {
                let mut sent = vec![vec![0; n as usize]; n as usize];
                let mut received = vec![vec![0; n as usize]; n as usize];
                for r in 0..n {
                    for p in phases(list, r, n).unwrap() {
                        match p {
                            Phase::Send { to, .. } => sent[r as usize][to as usize] += 1,
                            Phase::Recv { from } => received[from as usize][r as usize] += 1,
                            _ => {}
                        }
                    }
                }
                assert_eq!(sent, received, "{list:?} on {n} ranks");
            }
        }
        assert_eq!(
            phases(&["exchange:ring:1", "barrier"], 0, 1).unwrap(),
            vec![]
        );
    }

    #[test]
    fn bad_peers_are_named() {
        assert!(
            phases(&["send:7:1"], 0, 4)
                .unwrap_err()
                .contains("rank 7 is out of range (ranks are 0..=3)")
        );
        assert!(phases(&["recv:+4"], 1, 4).unwrap_err().contains("itself"));
        assert!(
            phases(&["exchange:pairs:1"], 0, 3)
                .unwrap_err()
                .contains("even number")
        );
    }
}
