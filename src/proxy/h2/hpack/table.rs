//! HPACK's two tables (RFC 7541 §2.3): the static one, and the dynamic one
//! a decoder keeps in step with its peer's encoder.

use std::collections::VecDeque;

use bytes::Bytes;

/// RFC 7541 Appendix A: index 1 is the first entry.
pub(super) const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// What an entry costs in a dynamic table: its bytes and 32 (§4.1).
pub(super) const ENTRY_OVERHEAD: usize = 32;

/// The decoder's dynamic table: newest entry first, evicted oldest first
/// to stay within `max_size`.
#[derive(Debug, Default)]
pub(super) struct Dynamic {
    entries: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max_size: usize,
}

impl Dynamic {
    pub(super) fn new(max_size: usize) -> Dynamic {
        Dynamic {
            entries: VecDeque::new(),
            size: 0,
            max_size,
        }
    }

    /// Entry `index` of both tables together (§2.3.3): 1 to 61 the static
    /// one, from 62 the dynamic one, newest first.
    pub(super) fn get(&self, index: usize) -> Option<(Bytes, Bytes)> {
        match index {
            0 => None,
            1..=61 => {
                let (name, value) = STATIC[index - 1];
                Some((Bytes::from_static(name), Bytes::from_static(value)))
            }
            _ => self.entries.get(index - 62).cloned(),
        }
    }

    /// Adds an entry, evicting what it needs room for; one larger than the
    /// whole table empties it and is not kept (§4.4).
    pub(super) fn insert(&mut self, name: Bytes, value: Bytes) {
        let cost = name.len() + value.len() + ENTRY_OVERHEAD;
        // Copied: a view of the read buffer would pin all of it for as
        // long as the entry stays, the connection's life at most.
        let (name, value) = (
            Bytes::copy_from_slice(&name),
            Bytes::copy_from_slice(&value),
        );
        self.evict_to(self.max_size.saturating_sub(cost));
        if cost <= self.max_size {
            self.size += cost;
            self.entries.push_front((name, value));
        }
    }

    pub(super) fn resize(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    fn evict_to(&mut self, room: usize) {
        while self.size > room {
            let Some((name, value)) = self.entries.pop_back() else {
                break;
            };
            self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
    }

    #[cfg(test)]
    pub(super) fn size(&self) -> usize {
        self.size
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}
