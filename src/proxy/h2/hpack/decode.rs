//! A header block decoded (RFC 7541 §6): the fields, in order, in one
//! buffer of their own, and the dynamic table kept in step with the
//! client's encoder.

use bytes::{Bytes, BytesMut};

use super::huffman::{self, HuffmanError};
use super::table::{Dynamic, ENTRY_OVERHEAD};

/// Why a header block was refused: each is a connection error
/// (COMPRESSION_ERROR, RFC 9113 §4.3), since the dynamic table can no
/// longer be trusted to match the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("integer in a header block is too large")]
    IntegerTooLarge,
    #[error("header block refers to table entry {0}, which does not exist")]
    NoSuchEntry(usize),
    #[error("dynamic table size update after a field, above the size baton allows, or a third in a block")]
    BadSizeUpdate,
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
}

/// One decoded field. Names are as the client wrote them: checking them
/// (lowercase, no pseudo-field after a regular one) is the request's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Bytes,
    pub value: Bytes,
}

/// Whether all of a block's fields were kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    Whole,
    /// The list is larger than the bound given (names, values and 32 bytes
    /// a field, RFC 9113 §6.5.2): the fields kept stop short of it. The
    /// block was still decoded to its end, so the table stays in step.
    TooLarge,
}

/// One connection's decoder.
#[derive(Debug)]
pub struct Decoder {
    table: Dynamic,
    /// The table size baton announced (SETTINGS_HEADER_TABLE_SIZE): the
    /// most a size update may ask for.
    limit: usize,
}

impl Decoder {
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            table: Dynamic::new(limit),
            limit,
        }
    }

    /// Decodes one whole header block into `fields` (empty), keeping those
    /// within `max_list` bytes, each in one buffer the size of the fields
    /// kept (`compacted`).
    pub fn decode(
        &mut self,
        block: &Bytes,
        max_list: usize,
        fields: &mut Vec<Field>,
    ) -> Result<Listed, DecodeError> {
        let mut at = 0;
        let mut listed = 0usize;
        let mut whole = true;
        let mut any_field = false;
        let mut size_updates = 0;
        while at < block.len() {
            let first = block[at];
            let field = if first & 0x80 != 0 {
                let index = integer(block, &mut at, 7)?;
                let (name, value) = self.entry(index)?;
                Field { name, value }
            } else if first & 0xe0 == 0x20 {
                let size = integer(block, &mut at, 5)?;
                // At most two (RFC 7541 §4.2): a block of a few fields
                // padded with a hundred thousand one-byte updates made
                // every stream hold 128 KiB.
                size_updates += 1;
                if any_field || size > self.limit || size_updates > 2 {
                    return Err(DecodeError::BadSizeUpdate);
                }
                self.table.resize(size);
                continue;
            } else {
                let indexed = first & 0xc0 == 0x40;
                let index = integer(block, &mut at, if indexed { 6 } else { 4 })?;
                let name = match index {
                    0 => string(block, &mut at)?,
                    _ => self.entry(index)?.0,
                };
                let value = string(block, &mut at)?;
                if indexed {
                    self.table.insert(name.clone(), value.clone());
                }
                Field { name, value }
            };
            any_field = true;
            listed += field.name.len() + field.value.len() + ENTRY_OVERHEAD;
            if listed > max_list {
                whole = false;
            }
            if whole {
                fields.push(field);
            }
        }
        compacted(fields);
        Ok(if whole {
            Listed::Whole
        } else {
            Listed::TooLarge
        })
    }

    fn entry(&self, index: usize) -> Result<(Bytes, Bytes), DecodeError> {
        self.table.get(index).ok_or(DecodeError::NoSuchEntry(index))
    }
}

/// `fields` moved into one buffer of their own size. A plain string is a
/// view of the block, and the block one of the connection's read buffer
/// (or a block gathered from CONTINUATIONs, up to 128 KiB), so one field
/// a stream kept for its life held all of it: a client's 100 streams of
/// padded blocks held 19 MiB, and any request its read buffer's 16 KiB.
/// One allocation a block, where a copy of each field would be one a
/// field.
fn compacted(fields: &mut [Field]) {
    let size = fields.iter().map(|f| f.name.len() + f.value.len()).sum();
    let mut all = BytesMut::with_capacity(size);
    for f in fields.iter() {
        all.extend_from_slice(&f.name);
        all.extend_from_slice(&f.value);
    }
    let mut all = all.freeze();
    for f in fields.iter_mut() {
        f.name = all.split_to(f.name.len());
        f.value = all.split_to(f.value.len());
    }
}

/// An integer with a `prefix`-bit prefix (§5.1), from `block[*at]` on.
/// Values past 2^28 are refused: nothing in a header block is that large.
fn integer(block: &[u8], at: &mut usize, prefix: u32) -> Result<usize, DecodeError> {
    let mask = (1u8 << prefix) - 1;
    let first = block.get(*at).ok_or(DecodeError::Truncated)? & mask;
    *at += 1;
    if first < mask {
        return Ok(usize::from(first));
    }
    let mut value = usize::from(mask);
    let mut shift = 0;
    loop {
        let byte = *block.get(*at).ok_or(DecodeError::Truncated)?;
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
        if shift > 21 {
            return Err(DecodeError::IntegerTooLarge);
        }
    }
}

/// A string literal (§5.2): a view of the block when written plain,
/// decoded into its own bytes when Huffman-coded.
fn string(block: &Bytes, at: &mut usize) -> Result<Bytes, DecodeError> {
    let coded = block.get(*at).ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = integer(block, at, 7)?;
    let end = at.checked_add(len).ok_or(DecodeError::Truncated)?;
    if end > block.len() {
        return Err(DecodeError::Truncated);
    }
    let raw = &block[*at..end];
    let out = if coded {
        // A code is 5 bits at the least: 8 bytes decode from 5 at most.
        let mut plain = Vec::with_capacity(len * 8 / 5 + 1);
        huffman::decode(raw, &mut plain)?;
        Bytes::from(plain)
    } else {
        block.slice(*at..end)
    };
    *at = end;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Bytes {
        let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        let pairs = digits.chunks(2);
        let bytes = pairs.map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16));
        Bytes::from(bytes.collect::<Result<Vec<u8>, _>>().expect("hex"))
    }

    fn decoded(decoder: &mut Decoder, block: &str) -> Vec<(String, String)> {
        let mut fields = Vec::new();
        let listed = decoder.decode(&hex(block), 65536, &mut fields);
        assert_eq!(listed, Ok(Listed::Whole));
        let text = |b: &Bytes| String::from_utf8(b.to_vec()).expect("utf-8");
        fields
            .iter()
            .map(|f| (text(&f.name), text(&f.value)))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn rfc_7541_c2_single_representations() {
        let mut d = Decoder::new(4096);
        let literal = "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572";
        assert_eq!(
            decoded(&mut d, literal),
            pairs(&[("custom-key", "custom-header")])
        );
        assert_eq!(d.table.size(), 55);
        let mut d = Decoder::new(4096);
        let plain = "040c 2f73 616d 706c 652f 7061 7468";
        assert_eq!(decoded(&mut d, plain), pairs(&[(":path", "/sample/path")]));
        assert_eq!(d.table.len(), 0);
        let never = "1008 7061 7373 776f 7264 0673 6563 7265 74";
        assert_eq!(decoded(&mut d, never), pairs(&[("password", "secret")]));
        assert_eq!(decoded(&mut d, "82"), pairs(&[(":method", "GET")]));
        assert_eq!(d.table.len(), 0);
    }

    /// C.3 and C.4: three requests on one connection, plain and then
    /// Huffman-coded; each refers to the entries the ones before added.
    #[test]
    fn rfc_7541_c3_c4_requests_share_the_table() {
        for blocks in [
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
        ] {
            let mut d = Decoder::new(4096);
            let first = [
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ];
            assert_eq!(decoded(&mut d, blocks[0]), pairs(&first));
            let mut second = first.to_vec();
            second.push(("cache-control", "no-cache"));
            assert_eq!(decoded(&mut d, blocks[1]), pairs(&second));
            let third = [
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ];
            assert_eq!(decoded(&mut d, blocks[2]), pairs(&third));
            assert_eq!(d.table.size(), 164);
            assert_eq!(d.table.len(), 3);
        }
    }

    /// C.5: responses through a 256-byte table, whose entries are evicted.
    #[test]
    fn rfc_7541_c5_evicts_the_oldest_entries() {
        let mut d = Decoder::new(256);
        let first = "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
                     2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
                     6c65 2e63 6f6d";
        assert_eq!(
            decoded(&mut d, first),
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(d.table.size(), 222);
        assert_eq!(decoded(&mut d, "4803 3330 37c1 c0bf")[0].1, "307");
        assert_eq!(d.table.size(), 222);
        let third = "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
                     54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
                     5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
                     3d31";
        let fields = decoded(&mut d, third);
        assert_eq!(fields[4], ("content-encoding".into(), "gzip".into()));
        assert_eq!(d.table.size(), 215);
        assert_eq!(d.table.len(), 3);
    }

    #[test]
    fn malformed_blocks_are_refused() {
        let refused = |block: &[u8], limit: usize| {
            let mut d = Decoder::new(limit);
            d.decode(&Bytes::copy_from_slice(block), 65536, &mut Vec::new())
                .expect_err("refused")
        };
        assert_eq!(refused(&[0x80], 4096), DecodeError::NoSuchEntry(0));
        assert_eq!(refused(&[0xbe], 4096), DecodeError::NoSuchEntry(62));
        assert_eq!(refused(&[0x40, 0x05, b'a'], 4096), DecodeError::Truncated);
        assert_eq!(refused(&[0xff], 4096), DecodeError::Truncated);
        assert_eq!(
            refused(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 4096),
            DecodeError::IntegerTooLarge
        );
        // A size update above the announced size, or after a field.
        assert_eq!(
            refused(&[0x3f, 0xe2, 0x1f], 4096),
            DecodeError::BadSizeUpdate
        );
        assert_eq!(refused(&[0x82, 0x20], 4096), DecodeError::BadSizeUpdate);
        assert_eq!(
            refused(&[0x20, 0x20, 0x20, 0x82], 4096),
            DecodeError::BadSizeUpdate,
            "a third size update in one block"
        );
        assert_eq!(
            refused(&[0x04, 0x81, 0x00], 4096),
            DecodeError::Huffman(HuffmanError::Padding)
        );
    }

    #[test]
    fn two_size_updates_are_taken_and_the_fields_hold_no_view_of_the_block() {
        let mut d = Decoder::new(4096);
        // Two size updates, then `:method: GET` and a literal `x: yy`.
        let block = hex("2020 82 0001 7802 7979");
        let mut fields = Vec::new();
        assert_eq!(d.decode(&block, 65536, &mut fields), Ok(Listed::Whole));
        assert_eq!(fields.len(), 2);
        let within = |b: &Bytes| {
            let range = block.as_ptr() as usize..block.as_ptr() as usize + block.len();
            range.contains(&(b.as_ptr() as usize))
        };
        assert!(
            fields.iter().all(|f| !within(&f.name) && !within(&f.value)),
            "a field is still a view of the block"
        );
        assert_eq!(
            (&fields[1].name[..], &fields[1].value[..]),
            (&b"x"[..], &b"yy"[..])
        );
    }

    #[test]
    fn a_list_past_its_bound_is_cut_but_the_table_kept() {
        let mut d = Decoder::new(4096);
        // Two incrementally indexed fields of 39 bytes each (with 32).
        let block = hex("4003 6162 6304 7878 7878 4003 6465 6604 7979 7979");
        let mut fields = Vec::new();
        assert_eq!(d.decode(&block, 50, &mut fields), Ok(Listed::TooLarge));
        assert_eq!(fields.len(), 1);
        assert_eq!(d.table.len(), 2);
    }
}
