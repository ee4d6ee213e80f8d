//! The HTTP accept loop, with the limits `axum::serve` does not set: a client has
//! `--request-read-timeout` to send a request's headers (hyper's header-read timer) and
//! a connection with no request in flight is closed after as long (the [`connection`]
//! watchdog: a socket that never sends a byte, an HTTP/2 connection without streams, an
//! idle keep-alive); a write waiting on a client that does not read closes its
//! connection after `--response-write-timeout`; at most `--max-connections` connections
//! are open at once (one more is answered 503 and closed); and on shutdown the listener
//! stops accepting while open connections finish.
//!
//! [`connection`]: crate::connection

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use crate::connection::{Activity, Counted, Watched};
use crate::parse_errors::Explained;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Most bytes of a request's headers by default (`--max-header-bytes`), which is also
/// what hyper buffers of an HTTP/1 connection's answer.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 << 10;

/// The least `--max-header-bytes` may be: hyper's HTTP/1 buffer starts at 8 KiB.
pub const MIN_MAX_HEADER_BYTES: usize = 8 << 10;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Longest a client may take to send a request's headers, and longest a keep-alive
    /// connection may stay idle between requests.
    pub read_timeout: Duration,
    /// Longest a write may wait on a client that does not read its answer.
    pub write_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most bytes of a request's headers (HTTP/1: 431 past it; HTTP/2: the header list
    /// is refused), and what hyper buffers of an HTTP/1 answer; at least
    /// [`MIN_MAX_HEADER_BYTES`].
    pub max_header_bytes: usize,
}

/// Serves `app` on `listener` until `stop` completes, then waits for the open
/// connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        // What hyper buffers of a connection's answer (and at most a request's headers):
        // a client that stops reading stops its stream once this is full.
        .max_buf_size(limits.max_header_bytes.max(MIN_MAX_HEADER_BYTES));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(limits.read_timeout));
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let activity = Activity::new();
        let service = TowerToHyperService::new(Counted::new(app.clone(), Arc::clone(&activity)));
        let socket = Watched::new(Explained::new(stream), Arc::clone(&activity));
        let connection = builder
            .serve_connection(TokioIo::new(socket), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                why = activity.watchdog(limits.read_timeout, limits.write_timeout) => {
                    tracing::debug!(why, "closing a connection");
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a connection over the limit with a 503 in the OpenAI error shape and closes it.
async fn refuse(mut stream: TcpStream, max: usize) {
    tracing::warn!(max, "too many open connections; refusing one");
    let body = serde_json::json!({"error": {
        "message": format!("the server has {max} connections open, its limit; retry later"),
        "type": "server_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}
