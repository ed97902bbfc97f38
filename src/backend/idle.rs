//! A backend's idle HTTP/1 connections, kept for the next request. A
//! connection comes back here only after a clean end of response with
//! keep-alive on both sides; it leaves as the freshest one the backend has
//! not closed meanwhile, as surely as the request needs: see [`Check`].
//! Connections idle longer than `IDLE_LIMIT`, below most backends'
//! keep-alive timeouts (nginx 75 s, Node 5 s, Go none; gunicorn's 2 s is
//! shorter, and its closes are found by the check), are closed rather
//! than reused.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::stream::{holds_nothing_back, BackendStream, Link};
use crate::stream::{reactor_saw_nothing, ByteStream};
use crate::workers::PerWorker;
use tokio::time::Instant;

/// Idle time after which a connection is closed rather than reused.
pub const IDLE_LIMIT: Duration = Duration::from_secs(4);
/// Idle connections kept per backend and worker, at most: beyond it a
/// returned connection is closed (bounded fds after a burst). Not much
/// lower: a worker takes a burst of responses before it reads the
/// requests that follow them, so the connections a load keeps busy all
/// come back at once. At 512, h2load's 640 streams (64 h2 connections, 10
/// streams each) had a share of theirs closed and opened again at once, 1,307
/// backend connections in 5 s where HAProxy, which keeps every idle one
/// (until `pool-purge-delay`), opened 640. Those fds were open during the
/// burst anyway, and an idle one is closed after `IDLE_LIMIT`.
const MAX_IDLE: usize = 4096;

/// The room an idle list keeps whatever its length: what a worker's
/// usual traffic to one backend holds, grown again only by a burst.
const KEPT_ROOM: usize = 64;

/// How a kept connection is found still usable before an exchange goes
/// out on it: nothing may be readable on its socket. EOF means the backend
/// closed it; bytes would be a response to nothing (or, under TLS, the
/// backend's close_notify) that the next request would read as its own,
/// maybe another client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    /// tokio's cached readiness, as HAProxy and nginx ask their event
    /// loops, and the kernel only when that cannot say: no syscall, where
    /// a kernel peek at every reuse cost a tenth of a keep-alive request's
    /// CPU (README, "Performance"). What came since the reactor last looked
    /// (at every wait on a quiet worker, every few dozen task polls on a
    /// busy one) goes unseen. Enough for a request that can be sent again
    /// (no body, an idempotent method), which is, on a fresh connection,
    /// if the kept one fails before any byte of a response; and after a
    /// response with a body, which a backend sends whole.
    Reactor,
    /// The kernel, with one non-blocking peek: a close or bytes that came
    /// up to the moment of reuse are seen. For a request that cannot be
    /// sent again, and after a response with no body (to HEAD, a 204 or
    /// 304, or a length of 0): a backend that sends a body there anyway
    /// sends it after the head, maybe just after the reactor last looked.
    Kernel,
}

impl Check {
    /// The check a request asks: the reactor's word will do for one that
    /// can be sent again (`replayable`), since it is if a kept connection
    /// fails under it.
    pub fn before_request(replayable: bool) -> Check {
        if replayable {
            Check::Reactor
        } else {
            Check::Kernel
        }
    }

    /// The check a connection needs after a response that had no body
    /// (`bodyless`: its framing said none) or one.
    pub fn after_response(bodyless: bool) -> Check {
        if bodyless {
            Check::Kernel
        } else {
            Check::Reactor
        }
    }
}

/// A kept connection, since when, and the check its last response asks.
struct Idle {
    stream: BackendStream,
    since: Instant,
    check: Check,
}

/// One worker's idle connections, oldest first: taken from the back,
/// expired from the front.
type IdleList = Mutex<Vec<Idle>>;

/// One list per worker: a connection is registered with its worker's
/// reactor and stays with that worker's requests.
pub struct IdleConnections {
    per_worker: PerWorker<IdleList>,
}

impl IdleConnections {
    pub fn new(workers: usize) -> IdleConnections {
        IdleConnections {
            per_worker: PerWorker::new(workers, |_| Mutex::default()),
        }
    }

    /// The calling worker's list.
    fn mine(&self) -> &IdleList {
        self.per_worker.mine()
    }

    /// The freshest connection still open, checked at least as `check`
    /// says (or as its last response asks, if that is stricter); closes
    /// those found closed, expired or holding stray bytes on the way.
    pub fn take(&self, check: Check) -> Option<BackendStream> {
        let Ok(mut conns) = self.mine().lock() else {
            return None;
        };
        while let Some(idle) = conns.pop() {
            if idle.since.elapsed() < IDLE_LIMIT
                && still_open(idle.stream.tcp(), check.max(idle.check))
            {
                return Some(idle.stream);
            }
            idle.stream.close_quietly();
        }
        None
    }

    /// A plain connection another worker keeps (the freshest of the first
    /// worker that keeps one), moved to the calling worker's reactor and
    /// found open by the kernel (this reactor has seen nothing of it). For
    /// a capped backend whose calling worker keeps none: the cap counts
    /// what the backend holds open, and each worker kept its own, so a
    /// backend that serves one connection at a time (what a cap of 1 is
    /// for) left a request on another worker waiting behind the idle one
    /// until it was swept (seconds, or a 504).
    /// HAProxy's threads take each other's idle connections too. A TLS
    /// session stays with its worker: tokio-rustls lets no socket out of
    /// one to be registered again.
    pub fn take_from_another(&self) -> Option<BackendStream> {
        let mine = self.per_worker.index();
        let others = self
            .per_worker
            .iter()
            .enumerate()
            .filter(|(worker, _)| *worker != mine);
        for (_, list) in others {
            while let Some(idle) = freshest_plain(list) {
                if idle.since.elapsed() >= IDLE_LIMIT {
                    continue;
                }
                if let Some(stream) = moved_here(idle.stream) {
                    return Some(stream);
                }
            }
        }
        None
    }

    /// Keeps `stream` for reuse, to be checked at least as `check` says
    /// then; drops connections that expired (and `stream` itself if its
    /// TLS session holds bytes back).
    pub fn put(&self, mut stream: BackendStream, check: Check) {
        if !holds_nothing_back(&mut stream) {
            // A TLS backend's own close_notify may be what it holds: the
            // reply it waits for.
            stream.close_quietly();
            return;
        }
        let Ok(mut conns) = self.mine().lock() else {
            return;
        };
        // One clock read for both (it is a vDSO call a request).
        let now = Instant::now();
        let expired = conns
            .iter()
            .take_while(|idle| now.duration_since(idle.since) >= IDLE_LIMIT)
            .count();
        conns
            .drain(..expired)
            .for_each(|idle| idle.stream.close_quietly());
        if conns.len() < MAX_IDLE {
            conns.push(Idle {
                stream,
                since: now,
                check,
            });
        } else {
            stream.close_quietly();
        }
    }

    /// Closes every connection idle past `IDLE_LIMIT` (run now and then,
    /// so a backend's closed connections do not linger after traffic stops).
    pub fn sweep(&self) {
        self.close_oldest(|idle| idle.since.elapsed() >= IDLE_LIMIT);
    }

    /// Closes every kept connection: its generation's work is done (a
    /// backend's FIN at the exit would read as a truncated session).
    pub fn close_all(&self) {
        self.close_oldest(|_| true);
    }

    /// Closes the connections of each worker's list, oldest first, while
    /// `expired` says so; once the list is unlocked: a TLS one's alert is
    /// sealed and sent, which that worker's requests need not wait for.
    fn close_oldest(&self, expired: impl Fn(&Idle) -> bool) {
        for list in self.per_worker.iter() {
            let closing: Vec<Idle> = {
                let mut conns = list.lock().unwrap_or_else(PoisonError::into_inner);
                let count = conns.iter().take_while(|idle| expired(idle)).count();
                let closing = conns.drain(..count).collect();
                // A burst's room is given back once the list is a quarter
                // of it (up to `MAX_IDLE` entries a worker, for good).
                if conns.capacity() > KEPT_ROOM && conns.len() < conns.capacity() / 4 {
                    let room = KEPT_ROOM.max(conns.len() * 2);
                    conns.shrink_to(room);
                }
                closing
            };
            closing
                .into_iter()
                .for_each(|idle| idle.stream.close_quietly());
        }
    }
}

/// The freshest plain connection of `list`, out of it.
fn freshest_plain(list: &IdleList) -> Option<Idle> {
    let mut conns = list.lock().unwrap_or_else(PoisonError::into_inner);
    let at = conns
        .iter()
        .rposition(|idle| matches!(idle.stream, Link::Plain(_)))?;
    Some(conns.remove(at))
}

/// `stream` registered with the calling worker's reactor, if it is a plain
/// connection the backend has not closed.
fn moved_here(stream: BackendStream) -> Option<BackendStream> {
    let Link::Plain(tcp) = stream else {
        return None;
    };
    let tcp = tokio::net::TcpStream::from_std(tcp.into_std().ok()?).ok()?;
    still_open(&tcp, Check::Kernel).then_some(Link::Plain(tcp))
}

impl Drop for IdleConnections {
    /// Its backend is gone (a member that left its pool's DNS answer):
    /// each kept connection is closed as the sweep closes one.
    fn drop(&mut self) {
        self.close_all();
    }
}

/// Whether nothing is readable on a kept connection's socket, asked as
/// `check` says (the kernel too when the reactor cannot say: see
/// [`reactor_saw_nothing`]).
pub fn still_open(stream: &tokio::net::TcpStream, check: Check) -> bool {
    if check == Check::Reactor && reactor_saw_nothing(stream) {
        return true;
    }
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit()];
    matches!(socket2::SockRef::from(stream).peek(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::{still_open, Check, IdleConnections};
    use crate::backend::stream::Link;
    use std::io::Write;
    use tokio::io::AsyncReadExt;

    /// The burst an h2 load returns at once (64 connections, 10 streams
    /// each) is kept whole, to serve the requests that follow it.
    #[tokio::test]
    async fn a_burst_of_640_returned_connections_is_all_kept() {
        const BURST: usize = 640;
        // Left in the listener's queue, not accepted: one fd a connection
        // here, under a shell's usual limit of 1024.
        let listener = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
        listener.bind(&any.into()).expect("bind");
        listener.listen(1024).expect("listen");
        let addr = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("bound address");
        let idle = IdleConnections::new(1);
        for _ in 0..BURST {
            let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            idle.put(Link::Plain(stream), Check::Reactor);
        }
        let kept = std::iter::from_fn(|| idle.take(Check::Reactor)).count();
        assert_eq!(kept, BURST);
    }

    /// A backend and baton's connection to it, after one short answer
    /// read (which leaves the reactor knowing the socket drained).
    async fn answered() -> (std::net::TcpStream, tokio::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut backend, _) = listener.accept().expect("accept");
        backend.write_all(b"answer").expect("answer");
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.expect("read the answer");
        assert_eq!(&buf[..n], b"answer");
        (backend, stream)
    }

    /// A plain connection worker 1 made and keeps is taken by worker 0 and
    /// works there while worker 1 is busy: it was registered with worker
    /// 0's reactor (one left with worker 1's would never be woken). One
    /// whose backend closed meanwhile is not taken. A capped backend
    /// serving one connection at a time waited behind another worker's
    /// idle one.
    #[tokio::test]
    async fn a_connection_another_worker_keeps_moves_to_the_one_that_takes_it() {
        use std::io::Read;
        use std::sync::Arc;
        use std::time::Duration;
        use tokio::io::AsyncWriteExt;
        let workers = crate::workers::Workers::start(2, false, Duration::ZERO).expect("workers");
        let idle = Arc::new(IdleConnections::new(2));
        let kept = Arc::clone(&idle);
        let mut backend = workers
            .for_shard(1)
            .spawn(async move {
                let (gone, older) = answered().await;
                let (backend, fresher) = answered().await;
                kept.put(Link::Plain(older), Check::Reactor);
                kept.put(Link::Plain(fresher), Check::Reactor);
                drop(gone);
                backend
            })
            .await
            .expect("worker 1");
        backend
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _busy = workers
            .for_shard(1)
            .spawn(async { std::thread::sleep(Duration::from_secs(3)) });
        let taking = Arc::clone(&idle);
        let exchange = workers.for_shard(0).spawn(async move {
            let mut taken = taking.take_from_another().expect("the open one");
            let asked = async {
                taken.write_all(b"next request").await.expect("written");
                let mut answer = [0u8; 6];
                taken.read_exact(&mut answer).await.expect("answer");
            };
            let answered = tokio::time::timeout(Duration::from_secs(2), asked).await;
            (answered.is_ok(), taking.take_from_another().is_some())
        });
        let mut got = [0u8; 12];
        if backend.read_exact(&mut got).is_ok() {
            std::io::Write::write_all(&mut backend, b"answer").expect("answer");
        }
        let (answered, another) = exchange.await.expect("worker 0");
        assert!(
            answered,
            "asked and answered on worker 0 while worker 1 slept"
        );
        assert_eq!(&got, b"next request");
        assert!(!another, "the one its backend closed is not taken");
    }

    /// Lets the reactor look (loopback delivers within the write call).
    async fn settle() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    /// A blocking pause, not a yield: the reactor does not look, the
    /// kernel holds what came (loopback delivers within the write call;
    /// the pause only makes sure).
    fn unseen_by_the_reactor() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    /// Bytes the reactor has not seen yet are found by the kernel check,
    /// asked by the request (one that cannot be sent again) or by the
    /// connection's last response (one with no body): the stricter
    /// of the two wins.
    #[tokio::test]
    async fn the_kernel_check_sees_what_the_reactor_has_not() {
        let (mut backend, stream) = answered().await;
        settle().await;
        assert!(still_open(&stream, Check::Kernel), "nothing more was sent");
        backend.write_all(b"stray").expect("stray bytes");
        unseen_by_the_reactor();
        assert!(
            !still_open(&stream, Check::Kernel),
            "the stray bytes went unseen"
        );
        for (after_response, asked) in [
            (Check::after_response(true), Check::Reactor),
            (Check::after_response(false), Check::Kernel),
        ] {
            let (mut backend, stream) = answered().await;
            let idle = IdleConnections::new(1);
            idle.put(Link::Plain(stream), after_response);
            backend.write_all(b"a body sent late").expect("stray bytes");
            unseen_by_the_reactor();
            assert!(
                idle.take(asked).is_none(),
                "kept after {after_response:?}, asked {asked:?}: the stray bytes went unseen"
            );
        }
    }

    /// Stray bytes or an EOF the reactor has seen make a connection
    /// unusable; with nothing sent it stays usable.
    #[tokio::test]
    async fn bytes_or_a_close_the_reactor_saw_make_a_connection_unusable() {
        let (mut backend, stream) = answered().await;
        settle().await;
        assert!(still_open(&stream, Check::Reactor), "nothing more was sent");
        backend.write_all(b"stray").expect("stray bytes");
        settle().await;
        assert!(
            !still_open(&stream, Check::Reactor),
            "the stray bytes went unseen"
        );
        let (backend, stream) = answered().await;
        drop(backend);
        settle().await;
        assert!(
            !still_open(&stream, Check::Reactor),
            "the close went unseen"
        );
    }

    /// A read that filled its buffer leaves the readiness standing (it
    /// cannot know the socket drained): the kernel says the connection is
    /// still usable, rather than every such connection being closed.
    #[tokio::test]
    async fn a_read_that_filled_its_buffer_leaves_the_kernel_to_say() {
        let (mut backend, mut stream) = answered().await;
        backend
            .write_all(&[b'x'; 64])
            .expect("a full buffer's worth");
        settle().await;
        let mut buf = [0u8; 64];
        assert_eq!(stream.read(&mut buf).await.expect("read"), 64);
        assert!(
            still_open(&stream, Check::Reactor),
            "nothing is left unread"
        );
        backend.write_all(b"stray").expect("stray bytes");
        unseen_by_the_reactor();
        assert!(
            !still_open(&stream, Check::Reactor),
            "the stray bytes went unseen"
        );
    }

    /// Out of its scheduling budget a task is told "pending" whatever the
    /// readiness: the kernel is asked, and stray bytes are seen.
    #[tokio::test]
    async fn a_task_out_of_budget_still_sees_stray_bytes() {
        let (mut backend, stream) = answered().await;
        backend.write_all(b"stray").expect("stray bytes");
        settle().await;
        let seen =
            crate::stream::out_of_budget(&stream, || still_open(&stream, Check::Reactor)).await;
        assert_eq!(seen, (true, false), "(budget spent, still open)");
    }
}
