//! The id that ties what a client was told to the log: made here, this
//! process's pid and a per-process count in hex, unique on the host for a
//! long while; or the client's own `X-Request-Id` where the listener
//! believes what its clients say of themselves.

use std::cell::Cell;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::config::Forwarded;

/// The longest made id: 8 hex digits of pid, `-`, 16 of count.
const MADE_LEN: usize = 25;

/// The longest client id kept: it also goes into a PROXY v2 header, at
/// most 128 bytes.
const SENT_LEN: usize = 128;

/// An exchange's id. A made one is held inline: one is made for every
/// request, and a `String` each time (with `format!` and a `getpid`, as
/// it first was) cost a few percent of an exchange's instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestId {
    Made { text: [u8; MADE_LEN], len: u8 },
    Sent(Box<str>),
}

impl RequestId {
    /// A new id from this process's count.
    pub fn new() -> RequestId {
        static PID: OnceLock<u32> = OnceLock::new();
        let n = next_count();
        let pid = *PID.get_or_init(std::process::id);
        let mut text = [0u8; MADE_LEN];
        let mut len = put_hex(&mut text, 0, u64::from(pid));
        text[len] = b'-';
        len = put_hex(&mut text, len + 1, n);
        RequestId::Made {
            text,
            len: len as u8,
        }
    }

    /// The client's own id (`sent`) where `forwarded` believes it and it is
    /// short and printable, else a new one.
    pub fn from_client(sent: Option<&[u8]>, forwarded: Forwarded) -> RequestId {
        let kept = sent
            .filter(|_| forwarded != Forwarded::Replace)
            .filter(|v| !v.is_empty() && v.len() <= SENT_LEN && v.iter().all(u8::is_ascii_graphic));
        match kept {
            Some(id) => RequestId::Sent(String::from_utf8_lossy(id).into()),
            None => RequestId::new(),
        }
    }

    /// The id's bytes, without the UTF-8 check `as_str` makes: what goes
    /// into a request head, once an exchange.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Made { text, len } => &text[..usize::from(*len)],
            RequestId::Sent(id) => id.as_bytes(),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            // Hex digits and `-`: always UTF-8.
            RequestId::Made { text, len } => {
                std::str::from_utf8(&text[..usize::from(*len)]).unwrap_or_default()
            }
            RequestId::Sent(id) => id,
        }
    }
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId::new()
    }
}

impl Deref for RequestId {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many numbers of the process's count a thread takes at once.
const COUNT_BLOCK: u64 = 1024;

/// The next number of the process's count for this thread: each thread
/// (each worker) takes a block of them at a time, so the shared count is
/// written once a block, not once a request (with two workers, its cache
/// line went from core to core at every request). Numbers stay unique in
/// the process; two workers' ids interleave out of order, as their
/// requests do.
fn next_count() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        /// The next number this thread gives, and the end of its block.
        static BLOCK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }
    BLOCK.with(|block| {
        let (next, end) = block.get();
        let (n, end) = if next < end {
            (next, end)
        } else {
            let start = NEXT.fetch_add(COUNT_BLOCK, Ordering::Relaxed);
            (start, start + COUNT_BLOCK)
        };
        block.set((n + 1, end));
        n
    })
}

/// Writes `value` in lower-case hex without leading zeros into `out` from
/// `at`; returns where it ended.
fn put_hex(out: &mut [u8], at: usize, value: u64) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let nibbles = (64 - value.leading_zeros()).div_ceil(4).max(1) as usize;
    for i in 0..nibbles {
        let shift = (nibbles - 1 - i) * 4;
        out[at + i] = DIGITS[((value >> shift) & 0xf) as usize];
    }
    at + nibbles
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_are_pid_and_count_in_hex() {
        let (a, b) = (RequestId::new(), RequestId::new());
        let pid = format!("{:x}", std::process::id());
        let count = |id: &str| {
            let (p, n) = id.split_once('-').expect("pid-count");
            assert_eq!(p, pid);
            u64::from_str_radix(n, 16).expect("hex")
        };
        assert_eq!(count(&b), count(&a) + 1);
        let mut hex = [0u8; MADE_LEN];
        let end = put_hex(&mut hex, 0, 0);
        let end = put_hex(&mut hex, end, 0xabc0_0001);
        assert_eq!(&hex[..end], b"0abc00001");
        let end = put_hex(&mut hex, 0, u64::MAX);
        assert_eq!(&hex[..end], b"ffffffffffffffff");
    }

    #[test]
    fn each_thread_counts_on_from_a_block_of_its_own() {
        let count = |id: RequestId| {
            let (_, n) = id.as_str().split_once('-').expect("pid-count");
            u64::from_str_radix(n, 16).expect("hex")
        };
        let first = count(RequestId::new());
        let elsewhere: Vec<u64> =
            std::thread::spawn(move || (0..3).map(|_| count(RequestId::new())).collect())
                .join()
                .expect("thread");
        // Another thread's ids in between take nothing from this one's.
        assert_eq!(count(RequestId::new()), first + 1);
        assert_eq!(elsewhere[2], elsewhere[0] + 2);
    }

    #[test]
    fn a_client_id_is_kept_only_where_believed_and_printable() {
        let sent = Some(&b"abc-123"[..]);
        assert_eq!(
            RequestId::from_client(sent, Forwarded::Append).as_str(),
            "abc-123"
        );
        assert_ne!(
            RequestId::from_client(sent, Forwarded::Replace).as_str(),
            "abc-123"
        );
        let spaced = RequestId::from_client(Some(b"a b"), Forwarded::Append);
        assert!(matches!(spaced, RequestId::Made { .. }));
        let long = vec![b'x'; SENT_LEN + 1];
        let long = RequestId::from_client(Some(&long), Forwarded::Append);
        assert!(matches!(long, RequestId::Made { .. }));
    }
}
