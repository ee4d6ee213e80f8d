//! One HTTP/1.1 GET, read within bounds that do not depend on the server answering it:
//! the connection is made to the addresses the caller checked (never resolved again), the
//! status line and headers take at most [`MAX_HEADER_BYTES`], a chunk-size line at most
//! [`MAX_LINE_BYTES`], every body byte is counted against the caller's budget before it
//! is kept, and every read and write ends at the deadline. No compression is asked for
//! (no bomb to inflate), and the connection is closed after the answer.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Most bytes of a status line and headers.
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// Most headers in an answer.
const MAX_HEADERS: usize = 64;
/// Most bytes of a chunk-size line or of a trailer line.
pub const MAX_LINE_BYTES: usize = 1 << 10;

/// Why a GET failed, in words a client may read (no address of the server's network).
#[derive(Debug, PartialEq, Eq)]
pub enum HttpError {
    /// The deadline passed.
    TimedOut,
    /// The budget of body bytes ran out.
    TooLarge,
    /// The request was abandoned (the client left, or another fetch failed).
    Stopped,
    /// Anything else, said in a few words.
    Failed(String),
}

/// An answer: its status, its `Location` (a redirect's), and its body (empty but for a
/// 2xx answer).
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The `Location` header, if any.
    pub location: Option<String>,
    /// The body of a 2xx answer.
    pub body: Vec<u8>,
}

/// What one GET may take.
pub struct Bounds<'a> {
    /// When every read and write ends.
    pub deadline: Instant,
    /// Body bytes left to the request (shared by its fetches).
    pub budget: &'a AtomicUsize,
    /// Checked between reads: set when the request is abandoned.
    pub stop: &'a dyn Fn() -> bool,
}

/// GETs `url` (http or https, with a host) from the first of `addresses` that accepts a
/// connection.
pub fn get(
    url: &url::Url,
    addresses: &[SocketAddr],
    bounds: &Bounds<'_>,
) -> Result<Answer, HttpError> {
    let host = url
        .host_str()
        .ok_or_else(|| HttpError::Failed("the URL has no host".into()))?;
    let tcp = connect(addresses, bounds.deadline)?;
    let socket = tcp.try_clone().map_err(io_failed)?;
    let stream: Box<dyn ReadWrite> = match url.scheme() {
        "https" => Box::new(tls(host, tcp)?),
        _ => Box::new(tcp),
    };
    let mut conn = Conn::new(stream, socket, bounds.deadline);
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let authority = &url[url::Position::BeforeHost..url::Position::AfterPort];
    let request = format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: ferrite/{}\r\n\
         Accept: image/*\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    conn.write_all(request.as_bytes())?;
    let head = conn.read_head()?;
    let mut answer = Answer {
        status: head.status,
        location: head.location,
        body: Vec::new(),
    };
    if (200..300).contains(&head.status) {
        answer.body = match head.framing {
            Framing::Chunked => conn.read_chunked(bounds)?,
            Framing::Length(n) => conn.read_exactly(n, bounds)?,
            Framing::UntilClose => conn.read_to_close(bounds)?,
        };
    }
    Ok(answer)
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

fn io_failed(e: io::Error) -> HttpError {
    if matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    ) {
        return HttpError::TimedOut;
    }
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        // The certificate not trusted, the handshake refused: said as rustls says it.
        Some(tls) => HttpError::Failed(format!("TLS failed: {tls}")),
        None => HttpError::Failed(format!("the connection failed ({})", e.kind())),
    }
}

fn connect(addresses: &[SocketAddr], deadline: Instant) -> Result<TcpStream, HttpError> {
    let mut last = HttpError::Failed("no address to connect to".into());
    for address in addresses {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HttpError::TimedOut);
        }
        match TcpStream::connect_timeout(address, left) {
            Ok(tcp) => return Ok(tcp),
            Err(e) => {
                last = match io_failed(e) {
                    HttpError::TimedOut => HttpError::TimedOut,
                    _ => HttpError::Failed("could not connect to the image's server".into()),
                }
            }
        }
    }
    Err(last)
}

/// The TLS client configuration: the public web's roots (webpki-roots), ring.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let config = rustls::ClientConfig::builder_with_provider(
            rustls::crypto::ring::default_provider().into(),
        )
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Arc::new(config)
    }))
}

fn tls(
    host: &str,
    tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, HttpError> {
    let name = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(name.to_string())
        .map_err(|_| HttpError::Failed("the host is no TLS server name".into()))?;
    let session = rustls::ClientConnection::new(tls_config(), name)
        .map_err(|_| HttpError::Failed("TLS could not start".into()))?;
    Ok(rustls::StreamOwned::new(session, tcp))
}

/// How the body of an answer ends.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Chunked,
    Length(usize),
    UntilClose,
}

struct Head {
    status: u16,
    location: Option<String>,
    framing: Framing,
}

/// A connection with a buffer, whose every read and write ends at the deadline.
struct Conn {
    stream: Box<dyn ReadWrite>,
    /// The socket itself, to set its timeouts (the TLS stream owns another handle).
    socket: TcpStream,
    deadline: Instant,
    buf: Vec<u8>,
    start: usize,
}

impl Conn {
    fn new(stream: Box<dyn ReadWrite>, socket: TcpStream, deadline: Instant) -> Self {
        Self {
            stream,
            socket,
            deadline,
            buf: Vec::new(),
            start: 0,
        }
    }

    fn arm(&self) -> Result<(), HttpError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HttpError::TimedOut);
        }
        self.socket
            .set_read_timeout(Some(left))
            .map_err(io_failed)?;
        self.socket.set_write_timeout(Some(left)).map_err(io_failed)
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        self.arm()?;
        let stream = &mut self.stream;
        stream
            .write_all(bytes)
            .and_then(|()| stream.flush())
            .map_err(io_failed)
    }

    /// Reads more into the buffer; false at the end of the stream.
    fn fill(&mut self) -> Result<bool, HttpError> {
        self.arm()?;
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let mut chunk = [0u8; 16 << 10];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A server that closes without TLS's close_notify ends its answer all
                // the same (the framing says whether anything is missing).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) => return Err(io_failed(e)),
            }
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn read_head(&mut self) -> Result<Head, HttpError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(self.pending()) {
                Ok(httparse::Status::Complete(used)) => {
                    let head = head_of(&response)?;
                    self.start += used;
                    return Ok(head);
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(HttpError::Failed("the answer has too many headers".into()))
                }
                Err(_) => return Err(HttpError::Failed("the answer is not HTTP/1.1".into())),
            }
            if self.pending().len() > MAX_HEADER_BYTES {
                return Err(HttpError::Failed(
                    "the answer's headers are too large".into(),
                ));
            }
            if !self.fill()? {
                return Err(HttpError::Failed("the answer ended in its headers".into()));
            }
        }
    }

    /// Counts `n` body bytes against the budget.
    fn spend(n: usize, bounds: &Bounds<'_>) -> Result<(), HttpError> {
        if (bounds.stop)() {
            return Err(HttpError::Stopped);
        }
        bounds
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .map(|_| ())
            .map_err(|_| HttpError::TooLarge)
    }

    fn read_exactly(&mut self, n: usize, bounds: &Bounds<'_>) -> Result<Vec<u8>, HttpError> {
        if n > bounds.budget.load(Ordering::Relaxed) {
            return Err(HttpError::TooLarge);
        }
        let mut body = Vec::with_capacity(n);
        while body.len() < n {
            if self.pending().is_empty() && !self.fill()? {
                return Err(HttpError::Failed("the answer ended early".into()));
            }
            let take = self.pending().len().min(n - body.len());
            Self::spend(take, bounds)?;
            body.extend_from_slice(&self.buf[self.start..self.start + take]);
            self.start += take;
        }
        Ok(body)
    }

    fn read_to_close(&mut self, bounds: &Bounds<'_>) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        loop {
            let take = self.pending().len();
            Self::spend(take, bounds)?;
            body.extend_from_slice(self.pending());
            self.start += take;
            if !self.fill()? {
                return Ok(body);
            }
        }
    }

    /// A line ending in CRLF (or LF), at most [`MAX_LINE_BYTES`].
    fn read_line(&mut self) -> Result<String, HttpError> {
        loop {
            if let Some(end) = self.pending().iter().position(|&b| b == b'\n') {
                let line = &self.pending()[..end];
                if line.len() > MAX_LINE_BYTES {
                    break;
                }
                let line = String::from_utf8_lossy(line)
                    .trim_end_matches('\r')
                    .to_string();
                self.start += end + 1;
                return Ok(line);
            }
            if self.pending().len() > MAX_LINE_BYTES {
                break;
            }
            if !self.fill()? {
                return Err(HttpError::Failed("the answer ended early".into()));
            }
        }
        Err(HttpError::Failed(
            "the answer's chunked framing is malformed".into(),
        ))
    }

    fn read_chunked(&mut self, bounds: &Bounds<'_>) -> Result<Vec<u8>, HttpError> {
        let malformed = || HttpError::Failed("the answer's chunked framing is malformed".into());
        let mut body = Vec::new();
        loop {
            let line = self.read_line()?;
            let size = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16).map_err(|_| malformed())?;
            if size == 0 {
                // Trailers, then the empty line.
                for _ in 0..MAX_HEADERS {
                    if self.read_line()?.is_empty() {
                        return Ok(body);
                    }
                }
                return Err(malformed());
            }
            // A size over the budget is refused before anything is read.
            body.extend(self.read_exactly(size, bounds)?);
            if !self.read_line()?.is_empty() {
                return Err(malformed());
            }
        }
    }
}

fn head_of(response: &httparse::Response<'_, '_>) -> Result<Head, HttpError> {
    let status = response
        .code
        .ok_or_else(|| HttpError::Failed("the answer has no status".into()))?;
    let header = |name: &str| {
        response
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
            .collect::<Vec<_>>()
    };
    let chunked = header("transfer-encoding")
        .iter()
        .flat_map(|v| {
            v.split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .next_back()
        .is_some_and(|last| last == "chunked");
    let lengths = header("content-length");
    let framing = if chunked {
        Framing::Chunked
    } else if let Some(first) = lengths.first() {
        if lengths.iter().any(|l| l != first) {
            return Err(HttpError::Failed("the answer has two lengths".into()));
        }
        Framing::Length(
            first
                .parse()
                .map_err(|_| HttpError::Failed("the answer's length is not a number".into()))?,
        )
    } else {
        Framing::UntilClose
    };
    Ok(Head {
        status,
        location: header("location").into_iter().next(),
        framing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::net::TcpListener;
    use std::time::Duration;

    /// A connection whose stream is `bytes` (the socket only carries the timeouts).
    fn conn(bytes: Vec<u8>) -> Conn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        struct Fake(Cursor<Vec<u8>>);
        impl Read for Fake {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                self.0.read(b)
            }
        }
        impl Write for Fake {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let fake = Box::new(Fake(Cursor::new(bytes)));
        Conn::new(fake, socket, Instant::now() + Duration::from_secs(5))
    }

    fn read(answer: &[u8], budget: usize) -> Result<(Head, Vec<u8>), HttpError> {
        let mut c = conn(answer.to_vec());
        let budget = AtomicUsize::new(budget);
        let bounds = Bounds {
            deadline: Instant::now() + Duration::from_secs(5),
            budget: &budget,
            stop: &|| false,
        };
        let head = c.read_head()?;
        let body = match head.framing {
            Framing::Chunked => c.read_chunked(&bounds)?,
            Framing::Length(n) => c.read_exactly(n, &bounds)?,
            Framing::UntilClose => c.read_to_close(&bounds)?,
        };
        Ok((head, body))
    }

    #[test]
    fn bodies_are_read_by_their_framing() {
        let (head, body) = read(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA",
            100,
        )
        .unwrap();
        assert_eq!((head.status, body.as_slice()), (200, &b"hello"[..]));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\n";
        assert_eq!(read(chunked, 100).unwrap().1, b"hello world");
        assert_eq!(
            read(b"HTTP/1.1 200 OK\r\n\r\nto the end", 100).unwrap().1,
            b"to the end"
        );
        let redirect = read(
            b"HTTP/1.1 302 Found\r\nLocation: /next\r\nContent-Length: 0\r\n\r\n",
            100,
        )
        .unwrap()
        .0;
        assert_eq!(
            (redirect.status, redirect.location.as_deref()),
            (302, Some("/next"))
        );
    }

    /// Bombs: an endless chunk-size line, endless headers, a length or chunk over the
    /// budget, a body over it without a length; each ends at its bound.
    #[test]
    fn every_part_of_an_answer_is_bounded() {
        let mut endless_size = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        endless_size.extend(std::iter::repeat_n(b'0', 1 << 20));
        assert!(
            matches!(read(&endless_size, 1 << 30), Err(HttpError::Failed(m)) if m.contains("malformed"))
        );
        let mut endless_head = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        endless_head.extend(std::iter::repeat_n(b'a', 1 << 20));
        assert!(
            matches!(read(&endless_head, 1 << 30), Err(HttpError::Failed(m)) if m.contains("too large"))
        );
        let many: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(
            matches!(read(many.as_bytes(), 100), Err(HttpError::Failed(m)) if m.contains("too many"))
        );
        assert_eq!(
            read(b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n", 100).err(),
            Some(HttpError::TooLarge)
        );
        assert_eq!(
            read(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n",
                100
            )
            .err(),
            Some(HttpError::TooLarge)
        );
        let long = [b"HTTP/1.1 200 OK\r\n\r\n".to_vec(), vec![7u8; 101]].concat();
        assert_eq!(read(&long, 100).err(), Some(HttpError::TooLarge));
        assert!(read(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            100
        )
        .is_err());
    }
}
