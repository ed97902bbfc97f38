//! Response heads encoded (RFC 7541 §6.2.2): each field a literal without
//! indexing, its name by its static table index where it has one, values
//! as written. No dynamic table and no Huffman coding, as HAProxy's
//! encoder: a response head costs a few bytes more on the wire and no
//! table lookups or inserts (the `h2` crate's encoder hashed every field
//! twice, 9 % of an h2 request's instructions). A client that lowers
//! SETTINGS_HEADER_TABLE_SIZE below the 4,096 a table starts with must
//! still be told the table's new size (RFC 7541 §4.2): [`table_size_zero`],
//! once, before the next block's fields.

/// The longest name in the static table (`access-control-allow-origin`).
const LONGEST_STATIC_NAME: usize = 27;

/// A dynamic table size update to 0 (§6.3): the encoder's table, never
/// used, is said to be empty, which any later table size allows.
pub fn table_size_zero(out: &mut Vec<u8>) {
    integer(0, 5, 0x20, out);
}

/// `:status`, indexed where the static table has the code.
pub fn status(code: u16, out: &mut Vec<u8>) {
    let index = match code {
        200 => 8,
        204 => 9,
        206 => 10,
        304 => 11,
        400 => 12,
        404 => 13,
        500 => 14,
        _ => 0,
    };
    if index != 0 {
        out.push(0x80 | index);
        return;
    }
    // Literal without indexing, name 8 (`:status`); codes are 3 digits.
    let code = code.min(999);
    out.extend_from_slice(&[
        0x08,
        3,
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]);
}

/// One field, its name lowercased on the way (h2 names are lowercase,
/// RFC 9113 §8.2.1; an HTTP/1 backend writes them as it likes).
pub fn field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    match static_name(name) {
        Some(index) => integer(index, 4, 0x00, out),
        None => {
            out.push(0x00);
            integer(name.len(), 7, 0x00, out);
            out.extend(name.iter().map(u8::to_ascii_lowercase));
        }
    }
    integer(value.len(), 7, 0x00, out);
    out.extend_from_slice(value);
}

/// An integer after a `prefix`-bit prefix (§5.1), the byte's other bits
/// being `flags`.
fn integer(mut value: usize, prefix: u32, flags: u8, out: &mut Vec<u8>) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    value -= mask;
    while value >= 0x80 {
        out.push(0x80 | (value & 0x7f) as u8);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The static table's index for `name`, in any case: one `match` the
/// compiler makes into a few compares (a search of the table compared
/// every name in turn, 8 % of an h2c request's instructions).
fn static_name(name: &[u8]) -> Option<usize> {
    if name.len() > LONGEST_STATIC_NAME {
        return None;
    }
    let mut folded = [0u8; LONGEST_STATIC_NAME];
    let folded = &mut folded[..name.len()];
    for (to, from) in folded.iter_mut().zip(name) {
        *to = from.to_ascii_lowercase();
    }
    Some(match &*folded {
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::decode::{Decoder, Listed};
    use super::super::table::STATIC;
    use super::*;

    #[test]
    fn a_response_head_decodes_to_itself_lowercased() {
        let mut block = Vec::new();
        status(200, &mut block);
        status(302, &mut block);
        field(b"Content-Type", b"text/plain", &mut block);
        field(b"X-Custom-Field", b"a value", &mut block);
        field(b"access-control-allow-origin", b"*", &mut block);
        let long = vec![b'v'; 300];
        field(b"Set-Cookie", &long, &mut block);
        let mut fields = Vec::new();
        let listed = Decoder::new(4096).decode(&Bytes::from(block), 65536, &mut fields);
        assert_eq!(listed, Ok(Listed::Whole));
        let got: Vec<(&[u8], &[u8])> = fields.iter().map(|f| (&f.name[..], &f.value[..])).collect();
        let want: Vec<(&[u8], &[u8])> = vec![
            (b":status", b"200"),
            (b":status", b"302"),
            (b"content-type", b"text/plain"),
            (b"x-custom-field", b"a value"),
            (b"access-control-allow-origin", b"*"),
            (b"set-cookie", &long),
        ];
        assert_eq!(got, want);
    }

    /// Every regular name of the static table is found at its index.
    #[test]
    fn the_static_names_are_those_of_the_table() {
        for (index, (name, _)) in STATIC.iter().enumerate().skip(14) {
            assert_eq!(static_name(name), Some(index + 1), "{name:?}");
        }
    }

    #[test]
    fn known_names_and_statuses_are_indexed() {
        let mut block = Vec::new();
        status(404, &mut block);
        field(b"Via", b"1.1 baton", &mut block);
        assert_eq!(&block[..2], [0x8d, 0x0f]);
        // Index 60 takes the 4-bit prefix and one more byte: 15 + 45.
        assert_eq!(block[2], 45);
        assert_eq!(static_name(b"WWW-Authenticate"), Some(61));
        assert_eq!(static_name(b"Accept-Charset"), Some(15));
        assert_eq!(static_name(b":status"), None);
        assert_eq!(static_name(b"x-request-id"), None);
    }

    #[test]
    fn integers_take_their_prefix_then_groups_of_seven() {
        // RFC 7541 C.1: 10 and 1337 with a 5-bit prefix, 42 with 8 bits.
        let mut out = Vec::new();
        integer(10, 5, 0, &mut out);
        integer(1337, 5, 0, &mut out);
        integer(42, 7, 0, &mut out);
        assert_eq!(out, [0x0a, 0x1f, 0x9a, 0x0a, 0x2a]);
    }
}
