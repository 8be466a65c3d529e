//! Mutual challenge-response before any guest byte moves: both ends prove they hold
//! the shared token with HMAC-SHA256 over both sides' fresh nonces, so neither a
//! stranger nor a replayed session gets a VM, and a source never sends a VM to a
//! destination that cannot prove it.
//!
//! ```text
//! destination -> source   "KUMOAUTH", mode (0: no token, 1: token), nonce_d [32]
//! source -> destination   nonce_s [32], HMAC(token, "src" | nonce_d | nonce_s) [32]
//! destination -> source   verdict (1: accepted, 0: refused),
//!                         then if accepted HMAC(token, "dst" | nonce_s | nonce_d) [32]
//! ```
//! Without a token on both ends the exchange still runs (mode 0, zero MACs), so a
//! mismatch of configuration (one side has a token, the other not) is refused too.

use std::io::{Read, Write};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const HELLO: &[u8; 8] = b"KUMOAUTH";
const NONCE: usize = 32;
const TAG: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the peer is not a kumo migration endpoint")]
    NotKumo,
    #[error("the destination requires a token (--token-file) and none was given")]
    TokenRequired,
    #[error("a token was given but the destination has none")]
    TokenNotExpected,
    #[error("the peer's token does not match (authentication failed)")]
    BadToken,
    #[error("the destination refused the token (authentication failed)")]
    Refused,
    #[error("authentication: {0}")]
    Io(#[from] std::io::Error),
}

fn mac(token: &[u8], label: &[u8], a: &[u8], b: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(token).unwrap_or_else(|_| {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&[]).expect("HMAC accepts an empty key")
    });
    mac.update(label);
    mac.update(a);
    mac.update(b);
    mac
}

fn tag(token: &[u8], label: &[u8], a: &[u8], b: &[u8]) -> [u8; TAG] {
    mac(token, label, a, b).finalize().into_bytes().into()
}

fn verify(token: &[u8], label: &[u8], a: &[u8], b: &[u8], got: &[u8]) -> bool {
    // Constant time (the Mac trait's comparison).
    mac(token, label, a, b).verify_slice(got).is_ok()
}

fn nonce() -> Result<[u8; NONCE], AuthError> {
    let mut n = [0u8; NONCE];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

/// The destination's side; `Ok` once the source proved the token (and was told).
pub fn destination(s: &mut (impl Read + Write), token: Option<&[u8]>) -> Result<(), AuthError> {
    let nonce_d = nonce()?;
    let mut hello = HELLO.to_vec();
    hello.push(u8::from(token.is_some()));
    hello.extend_from_slice(&nonce_d);
    s.write_all(&hello)?;
    s.flush()?;
    let mut answer = [0u8; NONCE + TAG];
    s.read_exact(&mut answer)?;
    let (nonce_s, their) = answer.split_at(NONCE);
    let ok = match token {
        Some(t) => verify(t, b"src", &nonce_d, nonce_s, their),
        None => their.iter().all(|&b| b == 0),
    };
    if !ok {
        let _ = s.write_all(&[0]);
        let _ = s.flush();
        return Err(if token.is_some() {
            AuthError::BadToken
        } else {
            AuthError::TokenNotExpected
        });
    }
    let mut reply = vec![1u8];
    reply.extend_from_slice(&match token {
        Some(t) => tag(t, b"dst", nonce_s, &nonce_d),
        None => [0; TAG],
    });
    s.write_all(&reply)?;
    s.flush()?;
    Ok(())
}

/// The source's side; `Ok` once the destination accepted and proved the token too.
pub fn source(s: &mut (impl Read + Write), token: Option<&[u8]>) -> Result<(), AuthError> {
    let mut hello = [0u8; 8 + 1 + NONCE];
    s.read_exact(&mut hello).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => AuthError::NotKumo,
        _ => AuthError::Io(e),
    })?;
    if &hello[..8] != HELLO || hello[8] > 1 {
        return Err(AuthError::NotKumo);
    }
    let wants_token = hello[8] == 1;
    let nonce_d = &hello[9..];
    let token = match (wants_token, token) {
        (true, Some(t)) => Some(t),
        (false, None) => None,
        (true, None) => return Err(AuthError::TokenRequired),
        (false, Some(_)) => return Err(AuthError::TokenNotExpected),
    };
    let nonce_s = nonce()?;
    let mut answer = nonce_s.to_vec();
    answer.extend_from_slice(&match token {
        Some(t) => tag(t, b"src", nonce_d, &nonce_s),
        None => [0; TAG],
    });
    s.write_all(&answer)?;
    s.flush()?;
    let mut verdict = [0u8; 1];
    s.read_exact(&mut verdict).map_err(|_| AuthError::Refused)?;
    if verdict[0] != 1 {
        return Err(AuthError::Refused);
    }
    let mut theirs = [0u8; TAG];
    s.read_exact(&mut theirs)?;
    let ok = match token {
        Some(t) => verify(t, b"dst", &nonce_s, nonce_d, &theirs),
        None => theirs.iter().all(|&b| b == 0),
    };
    if !ok {
        return Err(AuthError::BadToken);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    fn run(
        src: Option<&'static [u8]>,
        dst: Option<&'static [u8]>,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let d = std::thread::spawn(move || destination(&mut b, dst));
        let s = source(&mut a, src);
        drop(a);
        (s, d.join().unwrap())
    }

    #[test]
    fn matching_tokens_pass_both_ways() {
        let (s, d) = run(Some(b"secret"), Some(b"secret"));
        assert!(s.is_ok() && d.is_ok(), "{s:?} {d:?}");
        let (s, d) = run(None, None);
        assert!(s.is_ok() && d.is_ok(), "{s:?} {d:?}");
    }

    #[test]
    fn a_wrong_or_missing_token_is_refused() {
        let (s, d) = run(Some(b"guess"), Some(b"secret"));
        assert!(matches!(s, Err(AuthError::Refused)), "{s:?}");
        assert!(matches!(d, Err(AuthError::BadToken)), "{d:?}");
        let (s, _) = run(None, Some(b"secret"));
        assert!(matches!(s, Err(AuthError::TokenRequired)), "{s:?}");
        let (s, _) = run(Some(b"secret"), None);
        assert!(matches!(s, Err(AuthError::TokenNotExpected)), "{s:?}");
    }

    #[test]
    fn a_peer_that_is_not_kumo_is_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"HTTP/1.1 200 OK\r\n\r\n.................")
            .unwrap();
        drop(b);
        assert!(matches!(source(&mut a, None), Err(AuthError::NotKumo)));
    }
}
