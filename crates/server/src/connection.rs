//! One connection's watchdog: what hyper's own timers do not see. A connection with no
//! request in flight for `--request-read-timeout` is closed, whatever its protocol: one
//! that never sends a byte (hyper waits for the first bytes to tell HTTP/1 from HTTP/2
//! with no timer), an HTTP/2 connection kept open by its pings with no stream, an idle
//! keep-alive. A write that waits on a client that does not read for
//! `--response-write-timeout` closes the connection too, which drops its responses and
//! so frees their sequences.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http;
use axum::response::Response;
use axum::Router;
use http_body::Frame;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a connection has been doing, shared by its socket, its service and its watchdog.
pub struct Activity {
    epoch: Instant,
    /// Requests whose response is not yet fully written (or dropped).
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection opened), in ms since `epoch`.
    idle_since: AtomicU64,
    /// When a write started waiting on the client, in ms since `epoch` plus one (0: no
    /// write is waiting).
    write_waiting_since: AtomicU64,
}

impl Activity {
    /// A connection opened now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            write_waiting_since: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Waits until the connection should be closed, and says why: idle for longer than
    /// `idle`, or a write waiting on the client for longer than `write`.
    pub async fn watchdog(&self, idle: Duration, write: Duration) -> &'static str {
        let tick = (idle.min(write) / 4).max(Duration::from_millis(20));
        let (idle, write) = (idle.as_millis() as u64, write.as_millis() as u64);
        loop {
            tokio::time::sleep(tick).await;
            let now = self.now_ms();
            if self.in_flight.load(Ordering::Acquire) == 0
                && now.saturating_sub(self.idle_since.load(Ordering::Acquire)) > idle
            {
                return "no request within the read timeout";
            }
            let waiting = self.write_waiting_since.load(Ordering::Acquire);
            if waiting != 0 && now.saturating_sub(waiting - 1) > write {
                return "the client has not read its answer within the write timeout";
            }
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }
}

/// One request in flight on its connection, until its response body is dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity
            .idle_since
            .store(activity.now_ms(), Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The app as one connection's service: each request counts as in flight until its
/// response body is done with.
#[derive(Clone)]
pub struct Counted {
    app: Router,
    activity: Arc<Activity>,
}

impl Counted {
    /// `app` serving the connection whose `activity` this is.
    pub fn new(app: Router, activity: Arc<Activity>) -> Self {
        Self { app, activity }
    }
}

impl<B> tower::Service<http::Request<B>> for Counted
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let in_flight = self.activity.begin();
        let mut app = self.app.clone();
        Box::pin(async move {
            let response = tower::Service::call(&mut app, request.map(Body::new)).await?;
            Ok(response.map(|body| {
                Body::new(Counting {
                    body,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}

/// A response body that keeps its request counted as in flight.
struct Counting {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Counting {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A socket whose writes tell [`Activity`] when they wait on the client.
pub struct Watched<S> {
    socket: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    /// `socket`, reporting to `activity`.
    pub fn new(socket: S, activity: Arc<Activity>) -> Self {
        Self { socket, activity }
    }

    fn note<T>(&self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let waiting = &self.activity.write_waiting_since;
        match &poll {
            Poll::Pending => {
                let since = self.activity.now_ms() + 1;
                let _ = waiting.compare_exchange(0, since, Ordering::AcqRel, Ordering::Acquire);
            }
            Poll::Ready(_) => waiting.store(0, Ordering::Release),
        }
        poll
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.socket).poll_write(cx, buf);
        self.note(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.socket).poll_write_vectored(cx, bufs);
        self.note(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.socket).poll_flush(cx);
        self.note(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_shutdown(cx)
    }
}
