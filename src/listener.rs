//! A listening socket's accept loop (the socket itself, bound or adopted,
//! comes from `lifecycle::endpoint`). The loop stops at `max_connections`
//! (the kernel backlog holds the rest), backs off on EMFILE/ENFILE instead
//! of spinning, and on a real stop accepts what is already queued before
//! closing, since closing a listener with a non-empty queue resets those
//! clients.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::defer_accept::{set_defer_accept, stop_deferring, DEFERRED_AT_MOST};
use crate::telemetry::Throttle;

/// A task handed to [`Accept::alongside`].
pub type Alongside = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// What to do with an accepted connection.
pub trait Accept: Send + Sync + 'static {
    fn accepted(&self, stream: TcpStream, peer: SocketAddr, permit: Option<OwnedSemaphorePermit>);

    /// Runs `task` as the connections are run: waited for by their drain,
    /// and ended with them if it is forced. What serves an accept queue
    /// that must wait for fds (see `accept_queued`), counted as one open
    /// connection meanwhile (it stands for at least one).
    fn alongside(&self, task: Alongside);
}

/// One accept loop over one socket: a plain socket until it is registered
/// ([`Listener::register`]) with the reactor of the worker that runs it.
pub struct Listener<S = std::net::TcpListener> {
    pub socket: S,
    /// Everything else, which registering carries over as it is.
    pub settings: Settings,
}

/// A listener's own settings and shared state, beside its socket.
pub struct Settings {
    /// The listener's config name, for logs.
    pub name: Arc<str>,
    /// The config's, for [`Listener::listen`].
    pub backlog: i32,
    /// When its connections acknowledge their clients' bytes.
    pub acks: Acks,
    /// Whether the kernel queues a connection only once its first bytes
    /// came (see [`set_defer_accept`]).
    pub defer_accept: bool,
    pub shared: Arc<Shared>,
    /// Set TCP_NODELAY on each connection: the socket came without it, so
    /// connections queued on it before then do not inherit it (see
    /// `lifecycle::endpoint::Listening::nodelay_each`).
    pub nodelay_each: bool,
    /// Where the admin reads the socket's accept queue while it is open.
    pub queue: Arc<crate::metrics::kernel::AcceptQueue>,
}

/// When a listener's connections acknowledge the bytes their clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// At once, for a connection's first segments (the kernel's default).
    Prompt,
    /// With the answer (`TCP_QUICKACK` off on the listening socket, which
    /// connections take from it as their handshake completes): for plain
    /// HTTP, where the client speaks first and the response soon follows,
    /// so a new connection's request costs no ACK of its own, one packet of
    /// ten (HAProxy does the same on its HTTP listeners). The HTTP path
    /// asks for prompt ACKs again whenever it waits for more of a request
    /// (`proxy::h1::io::ack_promptly`): a client holding its next bytes
    /// until the last are acknowledged (Nagle) would wait for the delayed
    /// ACK, 40 ms.
    WithAnswer,
}

impl Acks {
    /// Sets them on a listening socket. Done as its accept loop starts,
    /// when this generation is the one taking its connections: a reload's
    /// new generation may fail before then, and the old one, whose
    /// listener may be TCP mode or TLS over the same socket, serves on as
    /// it was. (Connections whose handshake completed before take the
    /// socket's setting of then, whoever accepts them.)
    fn set_on(self, socket: &TcpListener) -> std::io::Result<()> {
        socket2::SockRef::from(socket).set_tcp_quickack(self == Acks::Prompt)
    }
}

/// What all the shards of one listener share: its `max_connections` (one
/// permit per open connection) and the throttles of its warnings, so a
/// listener warns once a second however many shards meet the same trouble.
/// A shard waiting for a connection holds no place: it would be a place
/// another shard's connection cannot take.
pub struct Shared {
    permits: Arc<Semaphore>,
    /// The cap is reached (and was counted); cleared once a place frees.
    full: AtomicBool,
    at_cap: Throttle,
    accept_errors: Throttle,
}

impl Shared {
    pub fn new(max_connections: usize) -> Arc<Shared> {
        Arc::new(Shared {
            permits: Arc::new(Semaphore::new(max_connections)),
            full: AtomicBool::new(false),
            at_cap: Throttle::new(),
            accept_errors: Throttle::new(),
        })
    }

    /// Waits until a connection may be taken (the kernel's backlog holds
    /// the rest meanwhile).
    async fn room(&self, name: &str) {
        if self.permits.available_permits() > 0 {
            return;
        }
        self.note_full(name);
        if let Ok(place) = self.permits.acquire().await {
            drop(place);
            self.full.store(false, Ordering::Relaxed);
        }
    }

    /// A place for an accepted connection; if another shard took the last
    /// one meanwhile, the connection waits for the next.
    async fn place(&self, name: &str) -> Option<OwnedSemaphorePermit> {
        if let Ok(place) = Arc::clone(&self.permits).try_acquire_owned() {
            return Some(place);
        }
        self.note_full(name);
        let place = Arc::clone(&self.permits).acquire_owned().await.ok();
        self.full.store(false, Ordering::Relaxed);
        place
    }

    /// Counts reaching the cap once however many shards meet it; logged
    /// once a second at most, since a listener held at the cap meets it
    /// at every close.
    fn note_full(&self, name: &str) {
        if self.full.swap(true, Ordering::Relaxed) {
            return;
        }
        metrics::counter!(crate::metrics::AT_CAPACITY, "listener" => name.to_string()).increment(1);
        if let Some(suppressed) = self.at_cap.ready() {
            tracing::warn!(listener = %name, suppressed, "max_connections reached; not accepting until a connection ends");
        }
    }
}

/// How an accept loop ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// The socket lives on elsewhere (a newer generation): just close our fd.
    HandedOver,
    /// We are the last holder: serve what is queued, then close.
    Last,
    /// A reload removed it: serve what is queued, then make it stop
    /// listening for every holder (`shutdown`), not only close our fd: a
    /// copy systemd's socket unit holds would go on queueing connections
    /// that nobody accepts, which hang until their clients give up.
    Removed,
}

impl Listener {
    /// Listens with the config's backlog, as the doors open: a socket a
    /// reload's new generation bound takes connections only from then
    /// (see `lifecycle::endpoint::Listening::listen`), and an adopted one
    /// takes a changed backlog.
    pub fn listen(&self) -> std::io::Result<()> {
        socket2::SockRef::from(&self.socket).listen(self.settings.backlog)
    }

    /// Registers the socket with the reactor of `worker`, whose accept loop
    /// runs it, so the connections it accepts stay on that worker. Only
    /// once it listens: epoll reads a socket that does not as hung up, a
    /// state tokio keeps for good, and the loop would spin on `EAGAIN`.
    /// Done before the generation says it accepts (see
    /// `Generation::make_ready`): a registration can fail (`epoll_ctl`: no
    /// memory, `fs.epoll.max_user_watches` used up), and it then fails the
    /// start or the reload, where the accept loop, left to find it out
    /// after the generation said it accepts, logged it and left a socket
    /// the kernel still gave its share of connections, which nobody
    /// accepted. (Readiness that comes before the loop runs is kept for it.)
    pub fn register(
        self,
        worker: &tokio::runtime::Handle,
    ) -> std::io::Result<Listener<TcpListener>> {
        let Listener { socket, settings } = self;
        debug_assert!(
            socket2::SockRef::from(&socket)
                .is_listener()
                .unwrap_or(true),
            "listener {}: watched before it listens",
            settings.name
        );
        let socket = {
            let _on = worker.enter();
            TcpListener::from_std(socket)?
        };
        Ok(Listener { socket, settings })
    }
}

impl Listener<TcpListener> {
    pub async fn run(
        self,
        handler: Arc<dyn Accept>,
        stop: CancellationToken,
        closing: impl FnOnce() -> Closing,
    ) {
        let Listener {
            socket,
            settings:
                Settings {
                    name,
                    shared,
                    nodelay_each,
                    queue,
                    acks,
                    defer_accept,
                    ..
                },
        } = self;
        if let Err(err) = acks.set_on(&socket) {
            tracing::warn!(listener = %name, cause = %err, "cannot set when connections acknowledge (TCP_QUICKACK)");
        }
        // Set, like the ACKs, once this generation takes the connections.
        if let Err(err) = set_defer_accept(std::os::fd::AsFd::as_fd(&socket), defer_accept) {
            tracing::warn!(listener = %name, cause = %err, "cannot set defer_accept");
        }
        // One wait on the stop token for the loop's whole life, polled only
        // when the branch before it is pending (`biased`): making a wait
        // per select registered and removed a waiter three times per
        // connection. `is_cancelled` (a load) keeps a stop from going
        // unseen while connections keep coming.
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        let shown = queue.show(std::os::fd::AsFd::as_fd(&socket));
        while !stop.is_cancelled() {
            tokio::select! {
                biased;
                () = shared.room(&name) => {}
                () = &mut stopped => break,
            }
            let accepted = tokio::select! {
                biased;
                a = socket.accept() => a,
                () = &mut stopped => break,
            };
            match accepted {
                Ok((stream, peer)) => {
                    if nodelay_each {
                        let _ = stream.set_nodelay(true);
                    }
                    let permit = tokio::select! {
                        biased;
                        p = shared.place(&name) => p,
                        // Stopping: it is served like the queued ones.
                        () = &mut stopped => None,
                    };
                    handler.accepted(stream, peer, permit);
                }
                Err(err) => {
                    if crate::shortage::is_own(&err) {
                        crate::metrics::shortage(crate::metrics::Shortage::Accept);
                    }
                    if let Some(suppressed) = shared.accept_errors.ready() {
                        tracing::warn!(listener = %name, cause = %err, suppressed, "accept failed; backing off");
                    }
                    tokio::select! {
                        biased;
                        () = &mut stopped => break,
                        () = tokio::time::sleep(backoff(&err)) => {}
                    }
                }
            }
        }
        // Before the socket closes, here or once its queue is served (and
        // before it, being declared after it, if this future is dropped).
        drop(shown);
        let closing = closing();
        if closing != Closing::HandedOver {
            // A connection the kernel still holds back for its first bytes
            // (`defer_accept`) is in no queue, and the close would reset it
            // as its request comes. A stop ended the deferral as it began
            // and kept the doors open since; a listener a reload removed
            // ends it here and waits until the kernel has queued them.
            if stop_deferring(std::os::fd::AsFd::as_fd(&socket)) {
                tokio::time::sleep(DEFERRED_AT_MOST).await;
            }
            let ending = Ending {
                nodelay_each,
                stop_listening: closing == Closing::Removed,
            };
            accept_queued(&name, &shared.permits, socket, &handler, ending);
        }
    }
}

/// Bounds `accept_queued` where the queue's length cannot be read: above
/// any backlog the kernel allows by default (`somaxconn` 4096).
const MOST_QUEUED: u64 = 65_536;

/// How `accept_queued` treats what it takes, and the socket after.
#[derive(Clone, Copy)]
struct Ending {
    /// Set TCP_NODELAY on each connection (see `Listener::nodelay_each`).
    nodelay_each: bool,
    /// Once the queue is served, stop the socket listening (`Closing::Removed`).
    stop_listening: bool,
}

/// Our last copy of a listening socket whose queue is being served. With
/// `stop_listening` it stops the socket listening for every process that
/// holds it as it drops, however its serving ends: the queue served, or
/// the task serving it as fds free up ended by a forced drain.
struct LastCopy {
    socket: std::net::TcpListener,
    name: Arc<str>,
    stop_listening: bool,
}

impl Drop for LastCopy {
    fn drop(&mut self) {
        if !self.stop_listening {
            return;
        }
        let name = &self.name;
        match socket2::SockRef::from(&self.socket).shutdown(std::net::Shutdown::Read) {
            Ok(()) => tracing::info!(listener = %name, "removed listener stopped listening"),
            Err(err) => {
                tracing::warn!(listener = %name, cause = %err, "removed listener may still listen")
            }
        }
    }
}

/// Accepts every connection already in the kernel's queue, without waiting:
/// as many as it held when this began, so a flood arriving meanwhile does
/// not keep this synchronous loop, and its thread, going for good. Out of
/// fds (a full table at a stop), closing the socket would reset the rest:
/// they are served as fds free up instead, by a task the drain waits for
/// (the drain is what frees them, and it begins only once every accept
/// loop has ended).
fn accept_queued(
    name: &Arc<str>,
    limit: &Arc<Semaphore>,
    socket: TcpListener,
    handler: &Arc<dyn Accept>,
    ending: Ending,
) {
    let std = match socket.into_std() {
        Ok(socket) => LastCopy {
            socket,
            name: Arc::clone(name),
            stop_listening: ending.stop_listening,
        },
        Err(err) => {
            tracing::warn!(listener = %name, cause = %err, "cannot drain accept queue");
            return;
        }
    };
    let queued = crate::metrics::kernel::accept_queue(std::os::fd::AsFd::as_fd(&std.socket))
        .unwrap_or(MOST_QUEUED);
    let nodelay_each = ending.nodelay_each;
    let Some(left) = accept_some(name, limit, &std.socket, &**handler, nodelay_each, queued) else {
        return;
    };
    tracing::warn!(listener = %name, left, "no fd free for the accept queue: serving it as the drain frees some");
    // The socket stays open meanwhile, the other shards closed: new
    // connections would join its queue, only to be reset when it closes
    // past them. With the backlog at its least, the full queue takes no
    // more (their SYNs go unanswered, and are refused once it closes),
    // and what it holds stays.
    if let Err(err) = socket2::SockRef::from(&std.socket).listen(0) {
        tracing::debug!(listener = %name, cause = %err, "cannot shrink the backlog of a queue waiting for fds");
    }
    let (limit, served_by) = (Arc::clone(limit), Arc::clone(handler));
    handler.alongside(Box::pin(async move {
        let mut left = left;
        loop {
            tokio::time::sleep(SHORT_BACKOFF).await;
            match accept_some(
                &std.name,
                &limit,
                &std.socket,
                &*served_by,
                nodelay_each,
                left,
            ) {
                Some(still) => left = still,
                None => return,
            }
        }
    }));
}

/// Accepts up to `count` queued connections from `std` (non-blocking) and
/// hands them to `handler`; `Some(left)` when an fd ran short with `left`
/// of them still to take.
fn accept_some(
    name: &str,
    limit: &Arc<Semaphore>,
    std: &std::net::TcpListener,
    handler: &dyn Accept,
    nodelay_each: bool,
    count: u64,
) -> Option<u64> {
    let mut served = 0usize;
    let mut short = None;
    for taken in 0..count {
        match std.accept() {
            Ok((stream, peer)) => {
                let permit = Arc::clone(limit).try_acquire_owned().ok();
                match stream
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(stream))
                {
                    Ok(stream) => {
                        served += 1;
                        if nodelay_each {
                            let _ = stream.set_nodelay(true);
                        }
                        handler.accepted(stream, peer, permit);
                    }
                    // Taken from the queue, but the reactor could not watch
                    // it (ENOSPC, ENOMEM): it is lost; the rest wait in the
                    // queue for the retry.
                    Err(err) if crate::shortage::is_own(&err) => {
                        crate::metrics::shortage(crate::metrics::Shortage::Accept);
                        tracing::warn!(listener = %name, cause = %err, "queued connection lost: baton ran short");
                        short = Some(count - taken - 1);
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(listener = %name, cause = %err, "queued connection lost")
                    }
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(err) if is_per_connection(&err) => continue,
            Err(err) if crate::shortage::is_own(&err) => {
                crate::metrics::shortage(crate::metrics::Shortage::Accept);
                short = Some(count - taken);
                break;
            }
            Err(err) => {
                tracing::warn!(listener = %name, cause = %err, "stopped draining accept queue");
                break;
            }
        }
    }
    if served > 0 {
        tracing::info!(listener = %name, connections = served, expected = true, "served the accept queue before closing");
    }
    short
}

/// Errors about one connection that died in the queue: just go on.
fn is_per_connection(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc_errno::ECONNABORTED | libc_errno::EPROTO | libc_errno::EPERM)
    )
}

/// How long an accept waits after baton ran short (of fds, memory):
/// long enough for connections to end meanwhile, short enough that a
/// queue's clients barely notice.
const SHORT_BACKOFF: Duration = Duration::from_millis(100);

fn backoff(err: &std::io::Error) -> Duration {
    if crate::shortage::is_own(err) {
        SHORT_BACKOFF
    } else if is_per_connection(err) {
        Duration::ZERO
    } else {
        Duration::from_millis(10)
    }
}

/// errno values we branch on, from nix (no libc dependency of our own).
mod libc_errno {
    use nix::errno::Errno;
    pub const ECONNABORTED: i32 = Errno::ECONNABORTED as i32;
    pub const EPROTO: i32 = Errno::EPROTO as i32;
    pub const EPERM: i32 = Errno::EPERM as i32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defer_accept::defers_accept;
    use std::os::fd::AsFd;
    use std::sync::{Mutex, PoisonError};

    /// Notes whether each accepted connection has TCP_NODELAY, and prompt
    /// ACKs (Linux reads `TCP_QUICKACK` as "not delaying").
    struct Noting(Mutex<Vec<(bool, bool)>>);

    impl Accept for Noting {
        fn accepted(&self, stream: TcpStream, _: SocketAddr, _: Option<OwnedSemaphorePermit>) {
            let nodelay = stream.nodelay().unwrap_or(false);
            let prompt = socket2::SockRef::from(&stream)
                .tcp_quickack()
                .unwrap_or(false);
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((nodelay, prompt));
        }

        fn alongside(&self, task: Alongside) {
            tokio::spawn(task);
        }
    }

    impl Noting {
        fn seen(&self) -> Vec<(bool, bool)> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }
    }

    /// A listener named "web" over `socket`, with room for 16.
    fn listener(
        socket: std::net::TcpListener,
        acks: Acks,
        defer_accept: bool,
        nodelay_each: bool,
    ) -> Listener {
        Listener {
            socket,
            settings: Settings {
                name: Arc::from("web"),
                backlog: 16,
                acks,
                defer_accept,
                queue: Default::default(),
                shared: Shared::new(16),
                nodelay_each,
            },
        }
    }

    /// `listener` registered with the test's runtime.
    fn registered(listener: Listener) -> Listener<TcpListener> {
        listener
            .register(&tokio::runtime::Handle::current())
            .expect("registered")
    }

    /// Runs an accept loop over `socket` with `acks` until it has handed
    /// `count` connections to `noting`.
    async fn accept_some(
        socket: std::net::TcpListener,
        acks: Acks,
        noting: &Arc<Noting>,
        count: usize,
    ) {
        let stop = CancellationToken::new();
        let listener = listener(socket, acks, false, false);
        let handler: Arc<dyn Accept> = Arc::clone(noting) as Arc<dyn Accept>;
        let run =
            tokio::spawn(registered(listener).run(handler, stop.clone(), || Closing::HandedOver));
        for _ in 0..1000 {
            if noting.seen().len() >= count {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        run.await.expect("the loop ends at the stop");
    }

    /// A plain HTTP listener's connections start delaying their ACKs, from
    /// the listening socket as its loop starts; a later generation taking
    /// the same socket for another kind of listener turns them back.
    #[tokio::test]
    async fn an_accept_loop_sets_when_its_connections_acknowledge() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("non-blocking");
        let at = socket.local_addr().expect("addr");
        let watched = socket.try_clone().expect("dup");
        // A connection takes the socket's setting as its handshake
        // completes: made once the loop has set it.
        let set_to = |prompt: bool| {
            let watched = &watched;
            async move {
                for _ in 0..200 {
                    if socket2::SockRef::from(watched).tcp_quickack().ok() == Some(prompt) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("the loop never set prompt ACKs to {prompt}");
            }
        };
        let noting = Arc::new(Noting(Mutex::new(Vec::new())));
        let first = tokio::spawn({
            let (socket, noting) = (socket.try_clone().expect("dup"), Arc::clone(&noting));
            async move { accept_some(socket, Acks::WithAnswer, &noting, 1).await }
        });
        set_to(false).await;
        let _http = std::net::TcpStream::connect(at).expect("connect");
        first.await.expect("first loop");
        let second = tokio::spawn({
            let noting = Arc::clone(&noting);
            async move { accept_some(socket, Acks::Prompt, &noting, 2).await }
        });
        set_to(true).await;
        let _tcp = std::net::TcpStream::connect(at).expect("connect");
        second.await.expect("second loop");
        let prompt: Vec<bool> = noting.seen().iter().map(|(_, p)| *p).collect();
        assert_eq!(prompt, [false, true]);
    }

    /// With `TCP_DEFER_ACCEPT` a connection whose client says nothing is
    /// not in the accept queue, and is once its first byte came; clearing
    /// it reports it was set, once.
    #[test]
    fn a_deferring_socket_queues_a_connection_once_its_first_bytes_come() {
        use std::io::Write;
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("non-blocking");
        set_defer_accept(socket.as_fd(), true).expect("set");
        let mut silent = std::net::TcpStream::connect(socket.local_addr().expect("addr"))
            .expect("the handshake completes");
        // Well within the SYN-ACK retransmission (1 s) that would queue it.
        std::thread::sleep(Duration::from_millis(100));
        let held = socket.accept().map(|_| ()).map_err(|e| e.kind());
        assert_eq!(held, Err(std::io::ErrorKind::WouldBlock));
        silent.write_all(b"G").expect("write");
        let queued = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(5));
            socket.accept().is_ok()
        });
        assert!(queued, "the connection was never queued once it spoke");
        assert!(stop_deferring(socket.as_fd()));
        assert!(!stop_deferring(socket.as_fd()), "cleared already");
    }

    /// The loop sets `TCP_DEFER_ACCEPT` as its listener says, whatever the
    /// socket had (a generation before may have set it otherwise).
    #[tokio::test]
    async fn an_accept_loop_defers_accepting_as_configured() {
        for defer in [true, false] {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            socket.set_nonblocking(true).expect("non-blocking");
            let watched = socket.try_clone().expect("dup");
            set_defer_accept(watched.as_fd(), !defer).expect("set");
            let stop = CancellationToken::new();
            let listener = listener(socket, Acks::Prompt, defer, false);
            let handler: Arc<dyn Accept> = Arc::new(Noting(Mutex::new(Vec::new())));
            let run = tokio::spawn(
                registered(listener).run(handler, stop.clone(), || Closing::HandedOver),
            );
            let mut set = false;
            for _ in 0..200 {
                if defers_accept(watched.as_fd()) == defer {
                    set = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop.cancel();
            run.await.expect("the loop ends at the stop");
            assert!(set, "the loop never set defer_accept to {defer}");
        }
    }

    /// A socket adopted without TCP_NODELAY (`nodelay_each`): a connection
    /// queued on it before then still gets it, set by the accept loop.
    #[tokio::test]
    async fn a_loop_over_a_socket_without_no_delay_sets_it_on_each_connection() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("non-blocking");
        let _queued =
            std::net::TcpStream::connect(socket.local_addr().expect("addr")).expect("connect");
        let noting = Arc::new(Noting(Mutex::new(Vec::new())));
        let stop = CancellationToken::new();
        let listener = listener(socket, Acks::Prompt, false, true);
        let handler: Arc<dyn Accept> = Arc::clone(&noting) as Arc<dyn Accept>;
        let run = tokio::spawn(registered(listener).run(handler, stop.clone(), || Closing::Last));
        for _ in 0..200 {
            if !noting
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        run.await.expect("the loop ends at the stop");
        assert_eq!(noting.seen(), [(true, true)]);
    }

    /// A socket another process holds a copy of (systemd's socket unit,
    /// here a dup): at a stop (`Last`) it goes on listening there for the
    /// next start; removed by a reload (`Removed`) its queue is served,
    /// then it refuses new connections, the copy open or not.
    #[tokio::test]
    async fn a_removed_listener_stops_listening_for_every_holder() {
        for (closing, listens_after) in [(Closing::Last, true), (Closing::Removed, false)] {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            socket.set_nonblocking(true).expect("non-blocking");
            let at = socket.local_addr().expect("addr");
            let systemds = socket.try_clone().expect("dup");
            let noting = Arc::new(Noting(Mutex::new(Vec::new())));
            let stop = CancellationToken::new();
            let listener = listener(socket, Acks::Prompt, false, false);
            let handler: Arc<dyn Accept> = Arc::clone(&noting) as Arc<dyn Accept>;
            stop.cancel();
            let _queued = std::net::TcpStream::connect(at).expect("connect");
            registered(listener)
                .run(handler, stop, move || closing)
                .await;
            assert_eq!(noting.seen().len(), 1, "{closing:?}: the queue is served");
            let later = std::net::TcpStream::connect(at).map_err(|e| e.kind());
            assert_eq!(later.is_ok(), listens_after, "{closing:?}: {later:?}");
            drop(systemds);
        }
    }

    /// Makes a new connection to `to` for each one accepted, 50 in all: a
    /// flood that keeps the queue full.
    struct Flooding {
        to: SocketAddr,
        made: Mutex<Vec<std::net::TcpStream>>,
        accepted: std::sync::atomic::AtomicUsize,
    }

    impl Accept for Flooding {
        fn accepted(&self, _: TcpStream, _: SocketAddr, _: Option<OwnedSemaphorePermit>) {
            self.accepted.fetch_add(1, Ordering::Relaxed);
            let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
            if made.len() < 50 {
                made.extend(std::net::TcpStream::connect(self.to));
            }
        }

        fn alongside(&self, task: Alongside) {
            tokio::spawn(task);
        }
    }

    /// Serving the queue at the last close takes what it held then, not a
    /// flood that keeps refilling it.
    #[tokio::test]
    async fn the_last_close_serves_the_queue_it_found_not_a_flood() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("non-blocking");
        let to = socket.local_addr().expect("addr");
        let queued: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(to).expect("connect"))
            .collect();
        let flooding = Arc::new(Flooding {
            to,
            made: Mutex::new(Vec::new()),
            accepted: Default::default(),
        });
        let socket = TcpListener::from_std(socket).expect("tokio listener");
        let handler: Arc<dyn Accept> = flooding.clone();
        accept_queued(
            &Arc::from("web"),
            &Arc::new(Semaphore::new(16)),
            socket,
            &handler,
            Ending {
                nodelay_each: false,
                stop_listening: false,
            },
        );
        assert_eq!(flooding.accepted.load(Ordering::Relaxed), queued.len());
    }
}
