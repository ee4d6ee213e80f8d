//! hyper answers a request it cannot parse by itself, before any service sees it: 400 for
//! a malformed request line or header, 414 for a URI too long, 431 for headers past the
//! read buffer, each with an empty body. docs/API.md promises every error a JSON body in
//! OpenAI's shape, so [`Explained`] recognises those answers as hyper writes them (a head
//! with one of those statuses and `content-length: 0`; the server's own errors always carry
//! a body) and writes the same status and headers with one.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose hyper-written parse-error answers get a JSON body.
pub struct Explained<S> {
    io: S,
    /// An answer being written in place of hyper's.
    replacing: Option<Replacing>,
}

/// Our answer, how much of it is written, and how many of hyper's bytes it stands for.
struct Replacing {
    bytes: Vec<u8>,
    written: usize,
    consumed: usize,
}

impl<S> Explained<S> {
    /// Wraps a connection's socket.
    pub fn new(io: S) -> Self {
        Self {
            io,
            replacing: None,
        }
    }
}

/// The answer to write instead of `written` and the bytes of `written` it replaces, when
/// `written` starts with hyper's own answer to a request it could not parse.
fn explain(written: &[u8]) -> Option<(Vec<u8>, usize)> {
    let rest = written.strip_prefix(b"HTTP/1.1 ")?;
    let (code, message) = match rest.get(..3)? {
        b"400" => (
            None,
            "the request could not be parsed as HTTP/1.1: its request line or a header is malformed",
        ),
        b"414" => (Some("uri_too_long"), "the request's URI is too long"),
        b"431" => (
            Some("headers_too_large"),
            "the request's headers are larger than this server accepts (64 KiB)",
        ),
        _ => return None,
    };
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&written[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?;
    let headers: Vec<&str> = lines.collect();
    if !headers
        .iter()
        .any(|h| h.eq_ignore_ascii_case("content-length: 0"))
    {
        return None;
    }
    let body = json!({"error": {
        "message": message, "type": "invalid_request_error", "param": null, "code": code,
    }})
    .to_string();
    let mut answer = format!(
        "{status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for header in headers {
        if !header.to_ascii_lowercase().starts_with("content-length:") {
            answer.push_str(header);
            answer.push_str("\r\n");
        }
    }
    answer.push_str("\r\n");
    answer.push_str(&body);
    Some((answer.into_bytes(), end + 4))
}

impl<S: AsyncWrite + Unpin> Explained<S> {
    /// Writes `buf`, or our answer in place of the hyper answer it starts with.
    fn write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.replacing.is_none() {
            if let Some((bytes, consumed)) = explain(buf) {
                self.replacing = Some(Replacing {
                    bytes,
                    written: 0,
                    consumed,
                });
            }
        }
        let Some(r) = self.replacing.as_mut() else {
            return Pin::new(&mut self.io).poll_write(cx, buf);
        };
        // hyper calls again with the same bytes after `Pending`: the answer goes on.
        while r.written < r.bytes.len() {
            match ready!(Pin::new(&mut self.io).poll_write(cx, &r.bytes[r.written..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => r.written += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let consumed = r.consumed;
        self.replacing = None;
        Poll::Ready(Ok(consumed))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Explained<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Explained<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // hyper's head is the first slice it writes.
        let first = bufs.iter().find(|b| !b.is_empty());
        match first {
            Some(first) if this.replacing.is_some() || explain(first).is_some() => {
                this.write(cx, first)
            }
            _ => Pin::new(&mut this.io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const HYPER_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sat, 28 Nov 2026 12:00:00 GMT\r\n\r\n";

    async fn through(written: &[u8]) -> String {
        // A small pipe: the answer is written in several pieces.
        let (ours, mut theirs) = tokio::io::duplex(16);
        let reader = tokio::spawn(async move {
            let mut out = Vec::new();
            theirs.read_to_end(&mut out).await.unwrap();
            out
        });
        let mut explained = Explained::new(ours);
        explained.write_all(written).await.unwrap();
        explained.shutdown().await.unwrap();
        drop(explained);
        String::from_utf8(reader.await.unwrap()).unwrap()
    }

    #[tokio::test]
    async fn hypers_empty_parse_error_answers_get_a_json_body() {
        let answer = through(HYPER_431).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("\r\ndate: Sat, 28 Nov 2026"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(!head.contains("content-length: 0"));
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], "headers_too_large");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }

    #[tokio::test]
    async fn other_answers_pass_unchanged() {
        for written in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"data: {\"HTTP/1.1 431 \"}\n\n",
        ] {
            assert_eq!(through(written).await.as_bytes(), written);
        }
    }
}
