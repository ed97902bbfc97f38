//! baton's own log goes to stderr: under systemd, the journal's stream
//! socket. A journal that stalls (a slow disk, journald busy or stopped)
//! fills that socket, and a plain `write(2)` then blocks the worker
//! thread that logged, and with it every connection that worker serves:
//! one line about one slow client would stall them all. So on a socket a
//! line is sent without waiting (`MSG_DONTWAIT`), and on a pipe (a log
//! collector's, a container runtime's) written so (`RWF_NOWAIT`); what
//! stderr cannot take now waits, in order, in a bounded queue that a
//! thread of its own writes out as the reader takes it; lines past the
//! bound are dropped, and how many is said once the queue is written out.
//! (HAProxy logs over a datagram socket and drops lines for the same
//! reason.) A terminal has no write that is sure not to wait (one
//! stopped with Ctrl-S, one whose reader fell behind: an ssh session on a
//! slow link), so each of its lines is written by that thread alone. A
//! file is written at once, as nginx writes its error log.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{send, MsgFlags};

/// Bytes of lines held for a stalled journal (or terminal), at most: some
/// thousands of lines, minutes of a generation's usual logging.
const QUEUE_BYTES: usize = 1 << 20;

/// The log's writer for `tracing_subscriber::fmt`, which writes each
/// event as one `write_all` of its whole line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line
    }
}

/// One event's line on its way to stderr.
pub struct Line;

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        outlet().take(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Waits, for `within` at most, until the lines held (for a stalled
/// journal, or a terminal's) are written out: a generation's last lines
/// say why it exits.
pub fn flush(within: Duration) {
    let outlet = outlet();
    let deadline = Instant::now() + within;
    let mut held = outlet.held();
    while !held.idle() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        held = outlet
            .changed
            .wait_timeout(held, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Flushes the held lines (`flush`) when dropped: at a return, and at
/// a panic that unwinds past it.
pub struct FlushedAtExit(pub Duration);

impl Drop for FlushedAtExit {
    fn drop(&mut self) {
        flush(self.0);
    }
}

struct Outlet {
    /// What stderr is: how a line may be written without waiting.
    kind: Kind,
    held: Mutex<Held>,
    /// A line came into the queue, or one was written out.
    changed: Condvar,
}

fn outlet() -> &'static Outlet {
    static OUTLET: OnceLock<Outlet> = OnceLock::new();
    OUTLET.get_or_init(|| Outlet {
        kind: stderr_kind(),
        held: Mutex::new(Held::default()),
        changed: Condvar::new(),
    })
}

/// What stderr is, for how a line is written to it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Sent at once without waiting (`MSG_DONTWAIT`).
    Socket,
    /// Written at once without waiting (`RWF_NOWAIT`).
    Pipe,
    /// Every line goes through the queue's thread, the only one that
    /// waits on it.
    Terminal,
    /// A file, `/dev/null`: written at once, waiting as a plain write
    /// does (a local disk takes a line without a wait worth a thread).
    Plain,
}

fn stderr_kind() -> Kind {
    use nix::sys::stat::SFlag;
    let Ok(stat) = nix::sys::stat::fstat(io::stderr()) else {
        return Kind::Plain;
    };
    match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFSOCK => Kind::Socket,
        SFlag::S_IFIFO => Kind::Pipe,
        _ if std::io::IsTerminal::is_terminal(&io::stderr()) => Kind::Terminal,
        _ => Kind::Plain,
    }
}

impl Outlet {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&'static self, line: &[u8]) {
        if self.kind == Kind::Plain {
            let _ = io::stderr().write_all(line);
            return;
        }
        let mut held = self.held();
        if held.broken {
            return;
        }
        if held.idle() && self.kind != Kind::Terminal {
            match send_now(self.kind, line) {
                Ok(sent) if sent == line.len() => {
                    held.last_whole = true;
                    // A count held back may be said now.
                    if held.dropped > 0 && held.writer_started {
                        self.changed.notify_all();
                    }
                    return;
                }
                // The rest of the line waits, ahead of any other, whatever
                // the bound: half a line would have the next glued to it.
                Ok(sent) => held.push_rest(&line[sent..]),
                // Nobody reads stderr any more: nothing to keep it for.
                Err(Errno::EPIPE | Errno::ECONNRESET) => {
                    held.break_off();
                    return;
                }
                // Full (or short of buffers; or a kernel whose pipes take
                // no RWF_NOWAIT): the queue's thread waits.
                Err(_) => held.push(line),
            }
        } else {
            held.push(line);
        }
        if !held.writer_started {
            held.writer_started = std::thread::Builder::new()
                .name("baton-log".into())
                .spawn(move || self.write_out())
                .is_ok();
        }
        if !held.writer_started {
            // No thread to write them (a limit on threads): written here,
            // waiting as a plain write does, rather than held for good.
            while let Some(line) = held.lines.pop_front() {
                held.bytes -= line.len();
                if write_whole(&line) == Written::Gone {
                    held.break_off();
                }
            }
            return;
        }
        self.changed.notify_all();
    }

    /// The queue's thread: writes the held lines out as stderr takes them
    /// (waiting, as a plain write does), then says how many were dropped.
    fn write_out(&self) {
        let mut held = self.held();
        loop {
            let Some(line) = held.lines.pop_front() else {
                let dropped = held.dropped_to_say();
                if dropped > 0 {
                    // Said through the queue (not idle while it is said),
                    // so an exit's flush waits for it too.
                    held.writing = true;
                    drop(held);
                    tracing::warn!(
                        dropped,
                        "log lines dropped: stderr (the journal, the terminal) took none for a while"
                    );
                    held = self.held();
                    held.writing = false;
                    self.changed.notify_all();
                    continue;
                }
                held = self
                    .changed
                    .wait(held)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            held.bytes -= line.len();
            held.writing = true;
            drop(held);
            let written = write_whole(&line);
            if written == Written::Short {
                // The line is lost, and the next try waits a moment, so
                // that a shortage that lasts is no spin.
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            held = self.held();
            held.writing = false;
            held.last_whole = written == Written::Whole;
            match written {
                Written::Whole => {}
                Written::Failed | Written::Short => held.dropped += 1,
                // Nobody reads stderr any more: every line after would
                // fail too, the count's own line among them.
                Written::Gone => held.break_off(),
            }
            self.changed.notify_all();
        }
    }
}

/// How a line's write ended.
#[derive(Debug, PartialEq)]
enum Written {
    Whole,
    /// Lost to an error that may pass (a full disk).
    Failed,
    /// Lost to a shortage of memory that may pass (ENOBUFS, ENOMEM).
    Short,
    /// stderr's reader is gone (a closed pipe or socket, a hung-up
    /// terminal: EIO).
    Gone,
}

/// Writes `line` to stderr, waiting as long as it takes (also where a
/// process sharing the socket made it non-blocking).
fn write_whole(mut line: &[u8]) -> Written {
    let mut stderr = io::stderr();
    while !line.is_empty() {
        match stderr.write(line) {
            Ok(0) => return Written::Gone,
            Ok(n) => line = &line[n..],
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                let mut ready = [nix::poll::PollFd::new(
                    stderr.as_fd(),
                    nix::poll::PollFlags::POLLOUT,
                )];
                let _ = nix::poll::poll(&mut ready, nix::poll::PollTimeout::from(1000u16));
            }
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) || err.raw_os_error() == Some(libc::EIO) =>
            {
                return Written::Gone
            }
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM)) => {
                return Written::Short
            }
            Err(_) => return Written::Failed,
        }
    }
    Written::Whole
}

/// A write that does not wait, whatever stderr's own mode (which is
/// shared with every process holding it: not ours to change).
fn send_now(kind: Kind, line: &[u8]) -> Result<usize, Errno> {
    let stderr = io::stderr();
    loop {
        let sent = match kind {
            // Not asked (`take` holds their lines): as if it were full.
            Kind::Terminal | Kind::Plain => Err(Errno::EAGAIN),
            Kind::Socket => send(
                stderr.as_raw_fd(),
                line,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ),
            Kind::Pipe => rustix::io::pwritev2(
                stderr.as_fd(),
                &[io::IoSlice::new(line)],
                u64::MAX,
                rustix::io::ReadWriteFlags::NOWAIT,
            )
            .map_err(|e| Errno::from_raw(e.raw_os_error())),
        };
        match sent {
            Err(Errno::EINTR) => continue,
            sent => return sent,
        }
    }
}

/// The lines waiting for stderr to take them.
#[derive(Debug, Default)]
struct Held {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// The queue's thread is writing a line out.
    writing: bool,
    /// Lines dropped since the queue was last empty.
    dropped: u64,
    writer_started: bool,
    /// stderr failed for good (its reader gone): lines go nowhere.
    broken: bool,
    /// The last line written out went whole.
    last_whole: bool,
}

impl Held {
    /// Nothing held or being written: a line may be sent at once, in order.
    fn idle(&self) -> bool {
        self.lines.is_empty() && !self.writing
    }

    /// stderr failed for good: nothing held, nothing taken from now on.
    fn break_off(&mut self) {
        self.broken = true;
        self.lines.clear();
        self.bytes = 0;
        self.dropped = 0;
    }

    /// How many lines were dropped, to be said now: once a line went out
    /// whole (a count that cannot be written either, as on a full disk,
    /// would only count itself, over and over).
    fn dropped_to_say(&mut self) -> u64 {
        match self.last_whole {
            true => std::mem::take(&mut self.dropped),
            false => 0,
        }
    }

    /// Holds `line`, or drops it past the bound.
    fn push(&mut self, line: &[u8]) {
        if self.bytes + line.len() > QUEUE_BYTES {
            self.dropped += 1;
            return;
        }
        self.push_rest(line);
    }

    /// Holds the rest of a line begun, whatever the bound.
    fn push_rest(&mut self, rest: &[u8]) {
        self.bytes += rest.len();
        self.lines.push_back(rest.to_vec());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_past_the_bound_are_dropped_and_counted() {
        let mut held = Held::default();
        let line = vec![b'x'; 1000];
        for _ in 0..(QUEUE_BYTES / line.len() + 5) {
            held.push(&line);
        }
        assert_eq!(held.lines.len(), QUEUE_BYTES / line.len());
        assert_eq!(held.dropped, 5);
        assert!(held.bytes <= QUEUE_BYTES);
        held.push_rest(b"the rest of a line begun\n");
        assert_eq!(
            held.lines.len(),
            QUEUE_BYTES / line.len() + 1,
            "held whole, past the bound"
        );
        assert!(!held.idle());
    }

    #[test]
    fn a_stderr_gone_for_good_holds_nothing() {
        let mut held = Held::default();
        held.push(b"a line\n");
        held.dropped = 3;
        held.break_off();
        assert!(held.idle() && held.broken && held.dropped == 0 && held.bytes == 0);
    }

    #[test]
    fn dropped_lines_are_counted_aloud_only_after_a_whole_write() {
        let mut held = Held {
            dropped: 2,
            ..Held::default()
        };
        assert_eq!(held.dropped_to_say(), 0, "the last write failed");
        assert_eq!(held.dropped, 2, "kept for later");
        held.last_whole = true;
        assert_eq!(held.dropped_to_say(), 2);
        assert_eq!(held.dropped_to_say(), 0, "said once");
    }

    #[test]
    fn a_queue_being_written_out_is_not_idle() {
        let mut held = Held::default();
        assert!(held.idle());
        held.writing = true;
        assert!(
            !held.idle(),
            "a line sent now would pass the one being written"
        );
    }
}
