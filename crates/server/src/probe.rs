//! `ferrite probe`: asks a running server whether it is healthy or ready, for a container's
//! `HEALTHCHECK` or an orchestrator's `exec` probe, where no `curl` is installed. The
//! runtime image holds the binary and nothing else, so the binary asks itself.
//!
//! The request is one plain HTTP/1.0 `GET` over loopback, with a deadline on the whole
//! exchange, and the answer is read only as far as its status line: the probe never
//! waits on a server that accepts the connection and then says nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Longest status line read (`HTTP/1.1 503 Service Unavailable` is 32 bytes).
const MAX_STATUS_LINE: usize = 256;

/// Where and what to ask.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The server's host: a listening address of `0.0.0.0` or `::` is asked on loopback.
    pub host: String,
    /// The server's port.
    pub port: u16,
    /// The path asked: `/health` (the process is alive) or `/ready` (it takes requests).
    pub path: String,
    /// Deadline for connecting, sending and reading the status line together.
    pub timeout: Duration,
}

impl Probe {
    /// The addresses to try, in order: the host's, except that an any-address (what a
    /// server listening on every interface is configured with) becomes loopback.
    fn addresses(&self) -> Result<Vec<SocketAddr>> {
        let host = match self.host.as_str() {
            "0.0.0.0" | "" => "127.0.0.1",
            "::" | "[::]" => "::1",
            h => h.trim_start_matches('[').trim_end_matches(']'),
        };
        let found: Vec<SocketAddr> = (host, self.port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))?
            .collect();
        anyhow::ensure!(!found.is_empty(), "{host} has no address");
        Ok(found)
    }

    /// Asks once: `Ok(status)` for any HTTP answer, an error where there was none in time.
    pub fn status(&self) -> Result<u16> {
        if !self.path.starts_with('/') || self.path.bytes().any(|b| b.is_ascii_whitespace()) {
            bail!(
                "the path must start with `/` and hold no spaces: {:?}",
                self.path
            );
        }
        let started = Instant::now();
        let left = || {
            self.timeout
                .checked_sub(started.elapsed())
                .filter(|d| !d.is_zero())
                .context("no answer within the timeout")
        };
        // `localhost` may name ::1 and 127.0.0.1: the first that takes the connection.
        let mut connected = None;
        let mut refused = None;
        for address in self.addresses()? {
            match TcpStream::connect_timeout(&address, left()?) {
                Ok(stream) => {
                    connected = Some((stream, address));
                    break;
                }
                Err(e) => {
                    refused =
                        Some(anyhow::Error::new(e).context(format!("connecting to {address}")))
                }
            }
        }
        let (mut stream, address) = match connected {
            Some(found) => found,
            None => return Err(refused.expect("at least one address was tried")),
        };
        stream.set_write_timeout(Some(left()?))?;
        let request = format!(
            "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: ferrite-probe\r\n\r\n",
            self.path, address
        );
        stream.write_all(request.as_bytes())?;
        let mut line = Vec::with_capacity(64);
        let mut byte = [0u8; 64];
        while !line.contains(&b'\n') && line.len() < MAX_STATUS_LINE {
            stream.set_read_timeout(Some(left()?))?;
            let n = stream.read(&mut byte).context("reading the answer")?;
            if n == 0 {
                break;
            }
            line.extend_from_slice(&byte[..n]);
        }
        parse_status(&line)
    }
}

/// The status code of an HTTP status line (`HTTP/1.x NNN reason`).
fn parse_status(answer: &[u8]) -> Result<u16> {
    let end = answer
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(answer.len());
    let line = String::from_utf8_lossy(&answer[..end]);
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(v), Some(Ok(code))) if v.starts_with("HTTP/") && (100..600).contains(&code) => {
            Ok(code)
        }
        _ => bail!("not an HTTP answer: {:?}", line.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// A one-connection server answering `answer` (after `delay`) and returning what it read.
    fn serve_once(answer: &'static [u8], delay: Duration) -> (u16, thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = [0u8; 512];
            let n = s.read(&mut got).unwrap();
            thread::sleep(delay);
            let _ = s.write_all(answer);
            String::from_utf8_lossy(&got[..n]).into_owned()
        });
        (port, handle)
    }

    fn probe(port: u16, path: &str, timeout_ms: u64) -> Probe {
        Probe {
            host: "0.0.0.0".into(),
            port,
            path: path.into(),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[test]
    fn reads_the_status_of_an_answer_and_asks_the_path_on_loopback() {
        let (port, server) = serve_once(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Duration::ZERO,
        );
        assert_eq!(probe(port, "/ready", 2000).status().unwrap(), 200);
        assert!(server
            .join()
            .unwrap()
            .starts_with("GET /ready HTTP/1.0\r\n"));
        let (port, _) = serve_once(b"HTTP/1.1 503 Service Unavailable\r\n\r\n", Duration::ZERO);
        assert_eq!(probe(port, "/ready", 2000).status().unwrap(), 503);
    }

    #[test]
    fn a_host_name_is_tried_at_each_of_its_addresses() {
        // `localhost` may resolve to ::1 first, where nothing listens.
        let (port, _) = serve_once(b"HTTP/1.1 200 OK\r\n\r\n", Duration::ZERO);
        let mut by_name = probe(port, "/health", 2000);
        by_name.host = "localhost".into();
        assert_eq!(by_name.status().unwrap(), 200);
    }

    #[test]
    fn a_silent_server_is_an_error_within_the_timeout() {
        let (port, _) = serve_once(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_secs(3));
        let started = Instant::now();
        assert!(probe(port, "/health", 300).status().is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn garbage_a_closed_port_and_a_bad_path_are_errors() {
        let (port, _) = serve_once(b"SSH-2.0-OpenSSH\r\n", Duration::ZERO);
        assert!(probe(port, "/health", 2000).status().is_err());
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert!(probe(closed, "/health", 2000).status().is_err());
        assert!(probe(closed, "health", 2000).status().is_err());
        assert!(probe(closed, "/a b", 2000).status().is_err());
    }

    #[test]
    fn status_lines_parse() {
        assert_eq!(parse_status(b"HTTP/1.1 204 No Content\r\n").unwrap(), 204);
        assert!(parse_status(b"HTTP/1.1 99 x\r\n").is_err());
        assert!(parse_status(b"").is_err());
    }
}
