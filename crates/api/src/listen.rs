//! Serving the API on one listener within limits, so that no local user (nor a remote one,
//! on TCP) can stop the agent answering: at most `max_connections` at once (past it a new
//! connection is closed at once, and the listener stays free for the next), at most
//! `max_connections_per_client` of them from one client (an address; all of loopback is
//! one client, so a task cannot spread its connections over 127.0.0.0/8), a request's
//! headers within `header_timeout` (a slow client holds nothing for long), and a
//! connection idle between requests for `idle_timeout` at most (a request being answered
//! is not idle, until the last byte of its answer is out: a quiet stream stays up). The
//! Unix socket has its own limits, so the operator is answered there whatever holds the
//! TCP listener.
//!
//! On a listener that needs tokens, `reserved_for_tokens` of `max_connections` are kept
//! for token holders: a connection past the ordinary ones (all taken, or its client's
//! share) is let into the reserve, and its first request must carry a valid token; one
//! that does not is answered 401 or 403 and closed. A connection in the reserve that has
//! not shown its token yet is closed to make room for a newer one, so connections that
//! send nothing cannot hold the reserve either; one that has shown a token keeps its place.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::access::AccessPolicy;
pub use berth_model::limits::ConnectionLimits;

/// A listener the API is served on.
pub trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// A connection, and the address of its peer (`None`: a Unix socket's).
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, Option<IpAddr>)>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<(Self::Io, Option<IpAddr>)> {
        let (stream, peer) = tokio::net::TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, Some(peer.ip())))
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<(Self::Io, Option<IpAddr>)> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        Ok((stream, None))
    }
}

/// Connections at once per peer address.
#[derive(Default)]
struct PerClient {
    open: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

/// One connection of a peer, counted while it lives.
struct ClientSlot {
    clients: Arc<PerClient>,
    peer: IpAddr,
}

impl PerClient {
    fn enter(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(peer).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            clients: self.clone(),
            peer,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// The client a peer counts as for `max_connections_per_client`: its address, except
/// that all of loopback (127.0.0.0/8, `::1`, and 127.0.0.0/8 mapped into IPv6) is one
/// client. A task on this machine can bind any loopback address as its source, and would
/// otherwise get a share for each.
fn client_of(peer: IpAddr) -> IpAddr {
    let peer = peer.to_canonical();
    if peer.is_loopback() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        peer
    }
}

/// The connections kept for token holders.
struct Reserve {
    size: usize,
    state: std::sync::Mutex<ReserveState>,
}

#[derive(Default)]
struct ReserveState {
    /// Connections holding a place (an evicted one has given its place up).
    held: usize,
    /// Those whose first request has not shown a token yet, oldest first.
    unproven: VecDeque<Arc<ReserveTicket>>,
}

/// One connection's place in the reserve.
#[derive(Default)]
struct ReserveTicket {
    /// Told when a newer connection took its place before it showed a token.
    evict: tokio::sync::Notify,
    evicted: AtomicBool,
}

/// A place in the reserve, given back when its connection ends.
struct ReserveSlot {
    reserve: Arc<Reserve>,
    ticket: Arc<ReserveTicket>,
}

impl Reserve {
    fn enter(self: &Arc<Self>) -> Option<ReserveSlot> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.held < self.size {
            state.held += 1;
        } else {
            // Full: the oldest connection that has not shown a token gives its place
            // up; when every place is a token holder's, the newcomer is refused.
            let oldest = state.unproven.pop_front()?;
            oldest.evicted.store(true, Ordering::SeqCst);
            oldest.evict.notify_one();
        }
        let ticket = Arc::new(ReserveTicket::default());
        state.unproven.push_back(ticket.clone());
        Some(ReserveSlot {
            reserve: self.clone(),
            ticket,
        })
    }
}

impl ReserveSlot {
    /// Its first request showed a token: it keeps its place. False when it was evicted
    /// meanwhile (its connection is closing).
    fn prove(&self) -> bool {
        let mut state = self.reserve.state.lock().unwrap_or_else(|e| e.into_inner());
        state.unproven.retain(|t| !Arc::ptr_eq(t, &self.ticket));
        !self.ticket.evicted.load(Ordering::SeqCst)
    }
}

impl Drop for ReserveSlot {
    fn drop(&mut self) {
        let mut state = self.reserve.state.lock().unwrap_or_else(|e| e.into_inner());
        state.unproven.retain(|t| !Arc::ptr_eq(t, &self.ticket));
        if !self.ticket.evicted.load(Ordering::SeqCst) {
            state.held -= 1;
        }
    }
}

/// What a connection in the reserve must show on its first request.
struct TokenGate {
    policy: Arc<AccessPolicy>,
    slot: ReserveSlot,
    passed: AtomicBool,
}

impl TokenGate {
    /// `None` when the request may go on; the answer that closes the connection
    /// otherwise.
    fn check(&self, headers: &axum::http::HeaderMap) -> Option<axum::response::Response> {
        if self.passed.load(Ordering::SeqCst) {
            return None;
        }
        let refusal = match self.policy.token_check(headers) {
            Ok(()) if self.slot.prove() => {
                self.passed.store(true, Ordering::SeqCst);
                return None;
            }
            Ok(()) => (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the agent is at its connection limit: try again".to_string(),
            ),
            Err(refusal) => refusal,
        };
        use axum::response::IntoResponse as _;
        let (status, error) = refusal;
        Some(
            (
                status,
                [(axum::http::header::CONNECTION, "close")],
                axum::Json(super::ApiError {
                    error,
                    problems: Vec::new(),
                }),
            )
                .into_response(),
        )
    }
}

/// What keeps a connection's place taken (its ordinary place, or its gate in the
/// reserve). The connection holds it, and so does what takes the connection over: an
/// upgraded connection (`alloc exec`'s websocket) counts against the limits for as long
/// as it lives, not only until it is handed off.
#[derive(Clone)]
pub struct ConnectionPlace(
    #[allow(dead_code, reason = "held, not read")] Arc<dyn std::any::Any + Send + Sync>,
);

/// One of the ordinary places, and its client's share (`None`: a Unix socket's), held
/// while the connection lives.
struct OrdinaryPlace {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _client: Option<ClientSlot>,
}

/// Serves `router` on `listener` until accepting fails for good. With `tokens` (a
/// listener that needs them), `limits.reserved_for_tokens` of its connections are kept
/// for requests that carry one.
pub async fn serve(
    listener: impl Listener,
    router: Router,
    limits: ConnectionLimits,
    tokens: Option<Arc<AccessPolicy>>,
) -> io::Result<()> {
    let reserved = match tokens {
        // At most half: the ordinary connections keep the other half.
        Some(_) => limits.reserved_for_tokens.min(limits.max_connections / 2),
        None => 0,
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(
        limits.max_connections - reserved,
    ));
    let reserve = Arc::new(Reserve {
        size: reserved,
        state: Default::default(),
    });
    let clients = Arc::new(PerClient::default());
    loop {
        let (io, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors, or a client that left before it was accepted: the
            // listener lives on.
            Err(error) if is_transient(&error) => {
                tracing::warn!(%error, "accepting an API connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(error) => return Err(error),
        };
        let client = match peer {
            Some(peer) => clients
                .enter(client_of(peer), limits.max_connections_per_client)
                .map(Some),
            None => Some(None),
        };
        // An ordinary place needs its client's share and a free place; past either, only
        // the reserve is left, and only where tokens are asked for.
        let ordinary = client.and_then(|client| {
            let slot = slots.clone().try_acquire_owned().ok()?;
            Some(OrdinaryPlace {
                _slot: slot,
                _client: client,
            })
        });
        // A place in the reserve lives in its gate, with the connection.
        let (place, gate) = match (ordinary, &tokens) {
            (Some(ordinary), _) => (Some(ordinary), None),
            (None, Some(policy)) => match reserve.enter() {
                Some(slot) => {
                    let ticket = slot.ticket.clone();
                    let gate = Arc::new(TokenGate {
                        policy: policy.clone(),
                        slot,
                        passed: AtomicBool::new(false),
                    });
                    (None, Some((gate, ticket)))
                }
                None => continue,
            },
            // Full: closed at once, so the backlog does not fill with waiting clients.
            (None, None) => continue,
        };
        let router = router.clone();
        let held = ConnectionPlace(Arc::new((
            place,
            gate.as_ref().map(|(gate, _)| gate.clone()),
        )));
        tokio::spawn(async move {
            let busy = Arc::new(AtomicUsize::new(0));
            let service = hyper_util::service::TowerToHyperService::new(CountBusy {
                inner: router,
                busy: busy.clone(),
                body_deadline: limits.idle_timeout,
                gate: gate.as_ref().map(|(gate, _)| gate.clone()),
                place: held.clone(),
            });
            let io = hyper_util::rt::TokioIo::new(IdleLimit::new(io, limits.idle_timeout, busy));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(io, service)
                // `alloc exec`'s websocket takes the connection over.
                .with_upgrades();
            match &gate {
                None => {
                    let _ = connection.await;
                }
                Some((_, ticket)) => {
                    // Closed when a newer connection takes its place before it has
                    // shown a token.
                    tokio::select! {
                        _ = connection => {}
                        () = ticket.evict.notified() => {}
                    }
                }
            }
            drop(held);
        });
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    ) || matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// The router, counting the requests of one connection being answered.
#[derive(Clone)]
struct CountBusy {
    inner: Router,
    busy: Arc<AtomicUsize>,
    /// How long a request's whole body may take to arrive.
    body_deadline: Duration,
    /// A connection in the reserve: its first request must carry a token.
    gate: Option<Arc<TokenGate>>,
    /// Handed to every request, for a handler that takes the connection over.
    place: ConnectionPlace,
}

impl<B> tower::Service<axum::http::Request<B>> for CountBusy
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<axum::http::Request<B>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut request: axum::http::Request<B>) -> Self::Future {
        if let Some(refusal) = self.gate.as_ref().and_then(|g| g.check(request.headers())) {
            return Box::pin(std::future::ready(Ok(refusal)));
        }
        request.extensions_mut().insert(self.place.clone());
        self.busy.fetch_add(1, Ordering::SeqCst);
        // Counted back when the answer is sent, or dropped unsent.
        let busy = Busy(self.busy.clone());
        // Busy, so not idle: the body then has its own deadline, or a client that sends
        // headers and never the body would hold the connection for good.
        let deadline = self.body_deadline;
        let request = request.map(|body| axum::body::Body::new(BodyDeadline::new(body, deadline)));
        let answer = tower::Service::call(&mut self.inner, request);
        Box::pin(async move {
            let response = answer.await;
            // Busy until the whole body is out: a stream (a log followed, the event
            // stream) is an answer being sent, however quiet, not an idle connection.
            Ok(response?.map(|body| axum::body::Body::new(BusyUntilSent { body, _busy: busy })))
        })
    }
}

/// One request of a connection being answered, counted while it lives.
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its connection busy until it is sent or dropped.
struct BusyUntilSent {
    body: axum::body::Body,
    /// Held, not read: dropped with the body.
    _busy: Busy,
}

impl hyper::body::Body for BusyUntilSent {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails once it has not arrived whole within its deadline (counted
/// from the headers): a client that stalls or trickles it holds a connection that long
/// at most.
struct BodyDeadline<B> {
    inner: Pin<Box<B>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<B> BodyDeadline<B> {
    fn new(inner: B, within: Duration) -> BodyDeadline<B> {
        BodyDeadline {
            inner: Box::pin(inner),
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl<B> hyper::body::Body for BodyDeadline<B>
where
    B: hyper::body::Body<Data = axum::body::Bytes>,
    B::Error: Into<axum::BoxError>,
{
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = self.inner.as_mut().poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Poll::Ready(Some(Err("the request body did not arrive in time".into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection that ends once no byte has moved for `idle` while no request of it is
/// being answered, or once an answer has waited `idle` for the client to read any of
/// it (a client that stops reading would otherwise hold the connection, and what is
/// queued for it, for good).
struct IdleLimit<T> {
    inner: T,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    busy: Arc<AtomicUsize>,
    /// Running while a write waits for the client to read: reset at the first wait
    /// after progress.
    write_deadline: Pin<Box<tokio::time::Sleep>>,
    write_waiting: bool,
}

impl<T> IdleLimit<T> {
    fn new(inner: T, idle: Duration, busy: Arc<AtomicUsize>) -> IdleLimit<T> {
        IdleLimit {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            busy,
            write_deadline: Box::pin(tokio::time::sleep(idle)),
            write_waiting: false,
        }
    }

    /// A write (or flush) could not proceed: the connection ends once it has waited
    /// `idle` since the last byte went out.
    fn write_waits(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if !self.write_waiting {
            self.write_waiting = true;
            let next = tokio::time::Instant::now() + self.idle;
            self.write_deadline.as_mut().reset(next);
        }
        match self.write_deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer for too long",
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn refresh(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleLimit<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.refresh();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                if self.busy.load(Ordering::SeqCst) > 0 {
                    // Answering: not idle; the wait starts when the answer is out.
                    self.refresh();
                    return Poll::Pending;
                }
                match self.deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection was idle too long",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleLimit<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, data);
        match written {
            Poll::Ready(Ok(n)) if n > 0 => {
                self.write_waiting = false;
                self.refresh();
            }
            Poll::Pending => {
                if let Poll::Ready(error) = self.write_waits(cx) {
                    return Poll::Ready(Err(error));
                }
            }
            _ => {}
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        match flushed {
            Poll::Ready(Ok(())) => self.write_waiting = false,
            Poll::Pending => {
                if let Poll::Ready(error) = self.write_waits(cx) {
                    return Poll::Ready(Err(error));
                }
            }
            Poll::Ready(Err(_)) => {}
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn all_of_loopback_is_one_client() {
        let one = client_of("127.0.0.1".parse().unwrap());
        for address in ["127.0.0.2", "127.255.255.254", "::1", "::ffff:127.9.8.7"] {
            assert_eq!(client_of(address.parse().unwrap()), one, "{address}");
        }
        assert_eq!(
            client_of("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_ne!(client_of("10.0.0.1".parse().unwrap()), one);
        assert_ne!(
            client_of("10.0.0.1".parse().unwrap()),
            client_of("10.0.0.2".parse().unwrap())
        );
    }

    /// A full reserve makes room by closing the oldest connection that has not shown a
    /// token; connections that have shown one keep their places.
    #[test]
    fn the_reserve_evicts_the_oldest_unproven_connection_and_never_a_token_holder() {
        let reserve = Arc::new(Reserve {
            size: 2,
            state: Default::default(),
        });
        let holder = reserve.enter().unwrap();
        assert!(holder.prove());
        let silent = reserve.enter().unwrap();
        let newcomer = reserve.enter().unwrap();
        assert!(silent.ticket.evicted.load(Ordering::SeqCst));
        assert!(
            !silent.prove(),
            "an evicted connection cannot take its place back"
        );
        assert!(!holder.ticket.evicted.load(Ordering::SeqCst));
        assert!(newcomer.prove());
        assert!(reserve.enter().is_none(), "every place is a token holder's");
        drop(silent);
        assert!(
            reserve.enter().is_none(),
            "an evicted connection gave no place back"
        );
        drop(holder);
        let next = reserve.enter().unwrap();
        drop((next, newcomer));
        assert_eq!(reserve.state.lock().unwrap().held, 0);
        assert!(reserve.state.lock().unwrap().unproven.is_empty());
    }

    /// A client that stops reading its answer: the write waits, and after the idle
    /// timeout the connection ends, however busy the answer keeps it. A client that
    /// reads slowly keeps its connection.
    #[tokio::test]
    async fn an_answer_the_client_stops_reading_ends_the_connection_at_the_idle_timeout() {
        let idle = Duration::from_millis(200);
        let (server, mut client) = tokio::io::duplex(1024);
        let busy = Arc::new(AtomicUsize::new(1));
        let mut connection = IdleLimit::new(server, idle, busy.clone());
        let started = tokio::time::Instant::now();
        let chunk = vec![b'x'; 512];
        let stalled = loop {
            match tokio::time::timeout(Duration::from_secs(5), connection.write_all(&chunk)).await {
                Ok(Ok(())) => continue,
                Ok(Err(error)) => break error,
                Err(_) => panic!("a write waited 5 s for a client that reads nothing"),
            }
        };
        assert_eq!(stalled.kind(), io::ErrorKind::TimedOut, "{stalled}");
        assert!(started.elapsed() >= idle, "{:?}", started.elapsed());

        // A slow reader: a write waits, but each read lets it go on.
        let (server, mut client_slow) = tokio::io::duplex(1024);
        let mut connection = IdleLimit::new(server, idle, busy);
        let reader = tokio::spawn(async move {
            let mut buffer = vec![0u8; 256];
            let mut total = 0;
            while total < 16 * 1024 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                total += client_slow.read(&mut buffer).await.unwrap();
            }
        });
        for _ in 0..32 {
            connection.write_all(&chunk).await.unwrap();
        }
        reader.await.unwrap();
        drop(client.shutdown().await);
    }
}
