//! Where access-log lines go: a file opened `O_APPEND` (or standard output),
//! written by a thread of its own so a slow disk never holds a connection
//! up. Each line is one `write(2)`: generations writing the same file at
//! once (an old one draining beside the new one) never tear or interleave
//! lines. The queue in front of the thread is bounded, in lines and in
//! bytes (a client makes a line long: its target, its User-Agent); a line
//! that finds it full is dropped and counted, never waited for. A line the
//! destination refuses (a full disk) is lost, and said so once a minute. SIGUSR1 makes every
//! writer reopen its path (after logrotate renamed the file); at teardown
//! the queue is written out before the generation exits.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use metrics::Counter;

/// Lines queued per destination before new ones are dropped.
const QUEUE: usize = 16 * 1024;
/// Bytes queued per destination before new lines are dropped.
const QUEUE_BYTES: usize = 16 * 1024 * 1024;
/// How often a destination that refuses lines is said to.
const FAILURE_REPORT: Duration = Duration::from_secs(60);
/// How often an idle writer looks for a reopen request.
const REOPEN_CHECK: Duration = Duration::from_millis(100);
/// How soon a reopen that failed is tried again: logrotate signals once,
/// and with `notifempty` never again for a log that stays empty.
const REOPEN_RETRY: Duration = Duration::from_secs(1);
/// How long teardown waits for a writer to finish its queue (a disk that
/// hangs must not keep a stopped generation alive forever).
const FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// The access log's destination as configured.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    Stdout,
    File(PathBuf),
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Stdout => f.write_str("stdout"),
            Destination::File(p) => write!(f, "{}", p.display()),
        }
    }
}

enum Message {
    /// A line, with the counter of its listener's lost lines.
    Line(Vec<u8>, Counter),
    /// Everything before this is written; the writer exits.
    Close,
}

/// One destination's queue and writer thread.
pub struct Sink {
    queue: SyncSender<Message>,
    /// Bytes in `queue`, bounded by `QUEUE_BYTES`.
    queued: Arc<AtomicUsize>,
    reopen: Arc<AtomicBool>,
    writer: Mutex<Option<JoinHandle<()>>>,
    destination: Destination,
}

impl Sink {
    /// Queues `line` (a whole line, newline included); false when the
    /// queue is full (in lines or bytes) or the writer is gone, and the
    /// line is dropped.
    /// Queues `line`, unless the queue is full (false); a line the
    /// destination then refuses (a full disk) is counted in `lost`.
    pub fn send(&self, line: Vec<u8>, lost: &Counter) -> bool {
        let len = line.len();
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        match self.queue.try_send(Message::Line(line, lost.clone())) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(len, Ordering::Relaxed);
                false
            }
        }
    }
}

/// Every destination a generation writes to, one writer per path however
/// many listeners share it.
#[derive(Default)]
pub struct Sinks {
    open: Mutex<HashMap<Destination, Arc<Sink>>>,
}

impl Sinks {
    /// The sink for `destination`, opening it (the file is created, mode
    /// 0640) the first time it is asked for.
    pub fn open(&self, destination: &Destination) -> std::io::Result<Arc<Sink>> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| std::io::Error::other("access log registry poisoned"))?;
        if let Some(sink) = open.get(destination) {
            return Ok(Arc::clone(sink));
        }
        let file = open_destination(destination)?;
        let (queue, lines) = mpsc::sync_channel(QUEUE);
        let reopen = Arc::new(AtomicBool::new(false));
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = Writer {
            destination: destination.clone(),
            file,
            reopen: Arc::clone(&reopen),
            queued: Arc::clone(&queued),
            failures: Failures::default(),
            torn: false,
            reopen_retry: None,
            reopen_failures: Failures::default(),
        };
        let handle = std::thread::Builder::new()
            .name("baton-access-log".into())
            .spawn(move || writer.run(&lines))?;
        let sink = Arc::new(Sink {
            queue,
            queued,
            reopen,
            writer: Mutex::new(Some(handle)),
            destination: destination.clone(),
        });
        open.insert(destination.clone(), Arc::clone(&sink));
        Ok(sink)
    }

    /// SIGUSR1: every writer reopens its path before its next line.
    pub fn reopen(&self) {
        if let Ok(open) = self.open.lock() {
            for sink in open.values() {
                sink.reopen.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Writes out every queued line and stops the writers (teardown, once
    /// no connection is left to log), giving up after `within` or
    /// `FLUSH_LIMIT`, whichever is sooner: a stop passes only what is left
    /// before systemd's `TimeoutStopSec`.
    pub fn close(&self, within: Duration) {
        let sinks: Vec<Arc<Sink>> = match self.open.lock() {
            Ok(mut open) => open.drain().map(|(_, s)| s).collect(),
            Err(_) => return,
        };
        // One deadline for all: each stuck destination (a hung mount, a
        // pipe nobody reads) must not add its own to a stop's time, which
        // TimeoutStopSec bounds. Every close is queued before any wait.
        let limit = within.min(FLUSH_LIMIT);
        let deadline = std::time::Instant::now() + limit;
        let closing: Vec<(Arc<Sink>, JoinHandle<()>)> = sinks
            .into_iter()
            .filter_map(|sink| {
                let handle = sink.writer.lock().ok().and_then(|mut w| w.take())?;
                if close_by(&sink.queue, deadline) {
                    Some((sink, handle))
                } else {
                    tracing::warn!(destination = %sink.destination, "access log not written out within {limit:?}; lines may be lost");
                    None
                }
            })
            .collect();
        for (sink, handle) in closing {
            join_by(handle, deadline, limit, &sink.destination);
        }
    }
}

/// Queues the close behind the lines, by `deadline`: a full queue in front
/// of a writer stuck in `write(2)` (a pipe nobody reads, a hung mount)
/// must not hold a stopping generation forever.
fn close_by(queue: &SyncSender<Message>, deadline: std::time::Instant) -> bool {
    loop {
        match queue.try_send(Message::Close) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => return true,
            Err(TrySendError::Full(_)) if std::time::Instant::now() >= deadline => return false,
            Err(TrySendError::Full(_)) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Waits for a writer thread until `deadline` (`limit` from the start).
fn join_by(
    handle: JoinHandle<()>,
    deadline: std::time::Instant,
    limit: Duration,
    destination: &Destination,
) {
    while !handle.is_finished() {
        if std::time::Instant::now() >= deadline {
            tracing::warn!(%destination, "access log not written out within {limit:?}; lines may be lost");
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = handle.join();
}

fn open_destination(destination: &Destination) -> std::io::Result<File> {
    match destination {
        Destination::Stdout => {
            let fd = std::os::fd::AsFd::as_fd(&std::io::stdout()).try_clone_to_owned()?;
            Ok(File::from(fd))
        }
        Destination::File(path) => open_file(path),
    }
}

/// Opened without blocking, then made to block again: a FIFO that no
/// process reads (a log shipper not running) fails the open at once, saying
/// so, where the open waited for a reader: a start that never became ready
/// (`check` took the path), a reopen at SIGUSR1 that held the writer for
/// ever. Read, a FIFO takes lines as a file does.
fn open_file(path: &Path) -> std::io::Result<File> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| {
            let fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
            match err.raw_os_error() {
                Some(libc::ENXIO) if fifo => {
                    std::io::Error::new(err.kind(), "a FIFO that no process reads")
                }
                _ => err,
            }
        })?;
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

struct Writer {
    destination: Destination,
    file: File,
    reopen: Arc<AtomicBool>,
    queued: Arc<AtomicUsize>,
    failures: Failures,
    /// The last write failed part-way: the file ends inside a line.
    torn: bool,
    /// A reopen failed: when to try again (the writer stays on the old
    /// file meanwhile), and its failures, said once a minute.
    reopen_retry: Option<std::time::Instant>,
    reopen_failures: Failures,
}

/// Writes all of `bytes`, saying how many went out before a failure.
fn write_counting(file: &mut File, mut bytes: &[u8]) -> (usize, std::io::Result<()>) {
    let mut written = 0;
    while !bytes.is_empty() {
        match file.write(bytes) {
            Ok(0) => return (written, Err(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                written += n;
                bytes = &bytes[n..];
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return (written, Err(err)),
        }
    }
    (written, Ok(()))
}

/// Lines a destination refused since it was last said, so a full disk is
/// one warning a minute (nginx's pace), not one per request flooding the
/// journal.
#[derive(Default)]
struct Failures {
    lost: u64,
    said_at: Option<std::time::Instant>,
}

impl Failures {
    /// Counts one lost line; the count to say now, if a minute passed
    /// since the last time (or this is the first).
    fn lost(&mut self, now: std::time::Instant) -> Option<u64> {
        self.lost += 1;
        self.said_if_due(now)
    }

    /// The lost lines not said yet, once the destination takes lines
    /// again, at the same pace: one that fails and takes lines by turns (a
    /// nearly full disk) would say one a request.
    fn recovered(&mut self, now: std::time::Instant) -> Option<u64> {
        self.said_if_due(now)
    }

    /// The count to say, if a minute passed since the last time (or
    /// there was none) and there is one.
    fn said_if_due(&mut self, now: std::time::Instant) -> Option<u64> {
        if self
            .said_at
            .is_some_and(|at| now.duration_since(at) < FAILURE_REPORT)
        {
            return None;
        }
        let said = self.unsaid()?;
        self.said_at = Some(now);
        Some(said)
    }

    /// The lost lines not said yet, whatever the pace (the writer stops):
    /// a warning a minute left the last minute's count unsaid.
    fn unsaid(&mut self) -> Option<u64> {
        (self.lost > 0).then(|| std::mem::take(&mut self.lost))
    }
}

impl Writer {
    fn run(mut self, lines: &mpsc::Receiver<Message>) {
        loop {
            let retry_due = self
                .reopen_retry
                .is_some_and(|at| std::time::Instant::now() >= at);
            if self.reopen.swap(false, Ordering::Relaxed) || retry_due {
                self.reopen_file();
            }
            match lines.recv_timeout(REOPEN_CHECK) {
                Ok(Message::Line(line, lost)) => {
                    self.queued.fetch_sub(line.len(), Ordering::Relaxed);
                    if !self.write(&line) {
                        lost.increment(1);
                    }
                }
                Ok(Message::Close) | Err(RecvTimeoutError::Disconnected) => {
                    if let Some(lost) = self.failures.unsaid() {
                        tracing::warn!(destination = %self.destination, lost, "access log lines not written before it closed");
                    }
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// One `write(2)` per line: with `O_APPEND` the kernel puts it whole at
    /// the end of the file, whoever else appends. False if it was lost.
    fn write(&mut self, line: &[u8]) -> bool {
        // A line cut short by an earlier failure is ended first, so this
        // one is not glued to it.
        if self.torn {
            match write_counting(&mut self.file, b"\n") {
                (_, Ok(())) => self.torn = false,
                (_, Err(err)) => {
                    self.lost(&err);
                    return false;
                }
            }
        }
        let (written, result) = write_counting(&mut self.file, line);
        match result {
            Ok(()) => {
                if self.failures.lost == 0 {
                    return true;
                }
                if let Some(lost) = self.failures.recovered(std::time::Instant::now()) {
                    tracing::warn!(destination = %self.destination, lost, "access log written again; lines lost since the last warning");
                }
                true
            }
            Err(err) => {
                self.torn = written > 0;
                self.lost(&err);
                false
            }
        }
    }

    fn lost(&mut self, err: &std::io::Error) {
        if let Some(lost) = self.failures.lost(std::time::Instant::now()) {
            tracing::warn!(destination = %self.destination, cause = %err, lost, "access log lines not written (said at most once a minute)");
        }
    }

    fn reopen_file(&mut self) {
        let Destination::File(path) = &self.destination else {
            return;
        };
        match open_file(path) {
            Ok(file) => {
                self.file = file;
                self.reopen_retry = None;
                tracing::info!(path = %path.display(), "access log reopened");
            }
            Err(err) => {
                let now = std::time::Instant::now();
                self.reopen_retry = Some(now + REOPEN_RETRY);
                if let Some(attempts) = self.reopen_failures.lost(now) {
                    tracing::warn!(path = %path.display(), cause = %err, attempts, "access log not reopened; writing to the old file and trying again every second (said at most once a minute)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO no process reads is refused at once, saying so (the open
    /// waited for a reader); one that is read takes lines, its writes
    /// blocking as a file's do.
    #[test]
    fn a_fifo_is_written_while_read_and_refused_while_not() {
        use std::io::Read;
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("access.pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let (opened, unread) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = opened.send(open_file(&path).map(drop));
        });
        let refused = unread
            .recv_timeout(Duration::from_secs(10))
            .expect("the open returned");
        let err = refused.expect_err("no reader");
        assert!(err.to_string().contains("no process reads"), "{err}");

        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .expect("reader");
        let mut file = open_file(&fifo).expect("a reader is there");
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL).expect("flags");
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags);
        assert!(!flags.contains(nix::fcntl::OFlag::O_NONBLOCK), "{flags:?}");
        file.write_all(b"line\n").expect("write");
        let mut got = [0u8; 5];
        reader.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"line\n");
    }

    #[test]
    fn lines_reach_the_file_whole_and_survive_a_rename_and_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log");
        let sinks = Sinks::default();
        let sink = sinks.open(&Destination::File(path.clone())).expect("open");
        assert!(sink.send(b"one\n".to_vec(), &Counter::noop()));
        // The same path is one writer, however many listeners ask.
        let again = sinks.open(&Destination::File(path.clone())).expect("open");
        assert!(Arc::ptr_eq(&sink, &again));
        let rotated = dir.path().join("access.log.1");
        // Written before the rename: wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&path).unwrap_or_default() != "one\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "first line never written"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::rename(&path, &rotated).expect("rename");
        sinks.reopen();
        std::thread::sleep(REOPEN_CHECK * 3);
        assert!(sink.send(b"two\n".to_vec(), &Counter::noop()));
        sinks.close(FLUSH_LIMIT);
        assert_eq!(std::fs::read_to_string(&rotated).expect("rotated"), "one\n");
        assert_eq!(std::fs::read_to_string(&path).expect("reopened"), "two\n");
    }

    /// A sink writing to a FIFO in `dir` whose reader (returned: the sink's
    /// writes fail once it is dropped) never reads: the pipe fills, the
    /// writer blocks.
    fn unread_fifo(dir: &tempfile::TempDir) -> (Sinks, Arc<Sink>, File) {
        let sinks = Sinks::default();
        let (sink, reader) = unread_fifo_in(&sinks, dir, "fifo");
        (sinks, sink, reader)
    }

    /// A destination of `sinks`: a FIFO named `name` that nobody reads.
    fn unread_fifo_in(sinks: &Sinks, dir: &tempfile::TempDir, name: &str) -> (Arc<Sink>, File) {
        let fifo = dir.path().join(name);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&fifo)
            .expect("reader");
        let sink = sinks.open(&Destination::File(fifo)).expect("open");
        (sink, reader)
    }

    #[test]
    fn the_queue_is_bounded_in_bytes_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sinks, sink, reader) = unread_fifo(&dir);
        // Lines of 256 KiB, as a client's long target makes them.
        let line = vec![b'x'; 256 * 1024];
        let taken = (0..200)
            .filter(|_| sink.send(line.clone(), &Counter::noop()))
            .count();
        let budget = QUEUE_BYTES / line.len();
        assert!(
            taken <= budget + 1,
            "{taken} lines of 256 KiB queued, past {budget}"
        );
        assert!(taken >= budget / 2, "{taken}: the budget is used");
        // Unblocked (its writes fail now), the writer ends its queue at once.
        drop(reader);
        sinks.close(FLUSH_LIMIT);
    }

    #[test]
    fn a_refusing_destination_is_said_once_a_minute_and_ends_no_line_glued() {
        let mut failures = Failures::default();
        let start = std::time::Instant::now();
        assert_eq!(failures.lost(start), Some(1), "the first is said");
        for i in 1..300 {
            assert_eq!(failures.lost(start + Duration::from_millis(i)), None);
        }
        assert_eq!(
            failures.lost(start + FAILURE_REPORT),
            Some(300),
            "a minute on, with the count since"
        );
        assert_eq!(failures.unsaid(), None, "all said");
        let later = start + FAILURE_REPORT;
        for i in 1..=7 {
            assert_eq!(failures.lost(later + Duration::from_millis(i)), None);
        }
        assert_eq!(
            failures.recovered(later + Duration::from_millis(8)),
            None,
            "taking lines again within the minute: held"
        );
        assert_eq!(failures.unsaid(), Some(7), "said at the close");
        assert_eq!(failures.unsaid(), None, "once");
        assert_eq!(failures.lost(later + FAILURE_REPORT), Some(1));
        assert_eq!(failures.lost(later + FAILURE_REPORT), None);
        assert_eq!(
            failures.recovered(later + FAILURE_REPORT * 2),
            Some(1),
            "taking lines again a minute on: said"
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log");
        let mut writer = Writer {
            destination: Destination::File(path.clone()),
            file: OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("full"),
            reopen: Arc::default(),
            queued: Arc::default(),
            failures: Failures::default(),
            torn: true,
            reopen_retry: None,
            reopen_failures: Failures::default(),
        };
        assert!(!writer.write(b"lost\n"), "refused by a full disk");
        writer.file = open_file(&path).expect("space again");
        assert!(writer.write(b"next\n"));
        assert_eq!(
            std::fs::read_to_string(&path).expect("log"),
            "\nnext\n",
            "the torn line ended before the next"
        );
    }

    #[test]
    fn a_writer_that_cannot_keep_up_drops_lines_and_never_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sinks, sink, _reader) = unread_fifo(&dir);
        let line = vec![b'x'; 511];
        let refused = (0..QUEUE * 4)
            .find(|_| !sink.send([line.clone(), b"\n".to_vec()].concat(), &Counter::noop()));
        assert!(refused.is_some(), "a full queue refuses lines");
        // Teardown gives up at its limit instead of waiting on the writer.
        let closing = std::time::Instant::now();
        sinks.close(FLUSH_LIMIT);
        assert!(closing.elapsed() < FLUSH_LIMIT + Duration::from_secs(3));
    }

    /// A stop gives teardown only what is left before systemd's
    /// `TimeoutStopSec`: a stuck destination is given up on by then.
    #[test]
    fn teardown_gives_up_within_the_time_it_is_given() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sinks, sink, _reader) = unread_fifo(&dir);
        let line = vec![b'x'; 511];
        while sink.send([line.clone(), b"\n".to_vec()].concat(), &Counter::noop()) {}
        let closing = std::time::Instant::now();
        sinks.close(Duration::from_millis(300));
        assert!(
            closing.elapsed() < Duration::from_secs(2),
            "given 300 ms, took {:?}",
            closing.elapsed()
        );
    }

    /// A reopen that fails (here the path is a directory for a while) is
    /// tried again until it works: logrotate's signal comes once, and the
    /// writer would otherwise stay on the rotated file for good.
    #[test]
    fn a_failed_reopen_is_tried_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log");
        let sinks = Sinks::default();
        let sink = sinks.open(&Destination::File(path.clone())).expect("open");
        std::fs::rename(&path, dir.path().join("access.log.1")).expect("rotate");
        std::fs::create_dir(&path).expect("in the way");
        sinks.reopen();
        assert!(sink.send(b"on the old file\n".to_vec(), &Counter::noop()));
        let rotated = dir.path().join("access.log.1");
        holds_in_time("the line reached the old file", || {
            std::fs::read_to_string(&rotated).unwrap_or_default() == "on the old file\n"
        });
        std::fs::remove_dir(&path).expect("out of the way");
        holds_in_time("reopened without a second signal", || path.is_file());
        assert!(sink.send(b"on the new file\n".to_vec(), &Counter::noop()));
        holds_in_time("the line reached the new file", || {
            std::fs::read_to_string(&path).unwrap_or_default() == "on the new file\n"
        });
        sinks.close(FLUSH_LIMIT);
    }

    /// Waits up to 10 s for `check`; panics saying `what` if it never holds.
    fn holds_in_time(what: &str, check: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A line the destination refuses (a full disk) is counted as lost in
    /// its listener's counter, as one the queue could not take is.
    #[test]
    fn a_line_the_destination_refuses_is_counted() {
        let sinks = Sinks::default();
        let full = PathBuf::from("/dev/full");
        let sink = sinks.open(&Destination::File(full)).expect("open");
        let lost = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Counter::from_arc(Arc::clone(&lost));
        assert!(sink.send(b"lost\n".to_vec(), &counter), "queued");
        sinks.close(FLUSH_LIMIT);
        assert_eq!(lost.load(Ordering::Relaxed), 1);
    }

    /// Three stuck destinations share one flush limit at teardown, not one
    /// each (a stop would pass TimeoutStopSec).
    #[test]
    fn stuck_destinations_share_one_flush_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sinks = Sinks::default();
        let line = vec![b'x'; 511];
        let _readers: Vec<File> = ["a", "b", "c"]
            .iter()
            .map(|name| {
                let (sink, reader) = unread_fifo_in(&sinks, &dir, name);
                while sink.send([line.clone(), b"\n".to_vec()].concat(), &Counter::noop()) {}
                reader
            })
            .collect();
        let closing = std::time::Instant::now();
        sinks.close(FLUSH_LIMIT);
        assert!(
            closing.elapsed() < FLUSH_LIMIT * 2,
            "one limit for all, not one each: {:?}",
            closing.elapsed()
        );
    }
}
