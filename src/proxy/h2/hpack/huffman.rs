//! HPACK's Huffman-coded strings (RFC 7541 §5.2), decoded.
//!
//! The code is canonical: codes of one length are consecutive numbers in
//! the order of their symbols, and each length's first code follows the
//! last of the length before. So a string decodes bit by bit with three
//! small tables (built at compile time from `CODES`), no tree: once the
//! bits read so far, as a number, fall within their length's run of codes,
//! they are a symbol.

use super::code::CODES;

/// Why a Huffman-coded string was refused (a COMPRESSION_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("Huffman-coded string contains EOS")]
    Eos,
    #[error("Huffman-coded string ends with padding that is not a prefix of EOS")]
    Padding,
}

/// The longest code, in bits (EOS and a few rare bytes).
const LONGEST: usize = 30;
const SYMBOLS: usize = 257;
const EOS: u16 = 256;

/// The canonical code, by length: each length's first code, how many codes
/// it has, and where its symbols start in `symbols` (sorted by code).
struct Canonical {
    first: [u32; LONGEST + 1],
    count: [u32; LONGEST + 1],
    start: [u16; LONGEST + 1],
    symbols: [u16; SYMBOLS],
}

const fn canonical() -> Canonical {
    let mut count = [0u32; LONGEST + 1];
    let mut i = 0;
    while i < SYMBOLS {
        count[CODES[i].1 as usize] += 1;
        i += 1;
    }
    let mut start = [0u16; LONGEST + 1];
    let mut len = 1;
    while len <= LONGEST {
        start[len] = start[len - 1] + count[len - 1] as u16;
        len += 1;
    }
    let mut symbols = [0u16; SYMBOLS];
    let mut next = start;
    i = 0;
    while i < SYMBOLS {
        let len = CODES[i].1 as usize;
        symbols[next[len] as usize] = i as u16;
        next[len] += 1;
        i += 1;
    }
    let mut first = [0u32; LONGEST + 1];
    len = 1;
    while len <= LONGEST {
        if count[len] > 0 {
            first[len] = CODES[symbols[start[len] as usize] as usize].0;
        }
        len += 1;
    }
    Canonical {
        first,
        count,
        start,
        symbols,
    }
}

static CODE: Canonical = canonical();

/// Appends the bytes `coded` decodes to `out`. Padding (RFC 7541 §5.2)
/// is at most 7 bits, all ones; a string holding EOS is refused.
pub fn decode(coded: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in coded {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let rank = code.wrapping_sub(CODE.first[len]);
            if rank < CODE.count[len] {
                let symbol = CODE.symbols[CODE.start[len] as usize + rank as usize];
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // Every 30-bit string holds a code (the code is complete), so `len`
    // stays under 30 here; what is left must be EOS's first bits.
    if len > 7 || code != (1 << len) - 1 {
        return Err(HuffmanError::Padding);
    }
    Ok(())
}

#[cfg(test)]
pub(super) fn encode(plain: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut bits, mut held) = (0u64, 0u32);
    for &b in plain {
        let (code, len) = CODES[usize::from(b)];
        bits = (bits << len) | u64::from(code);
        held += u32::from(len);
        while held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
        }
    }
    if held > 0 {
        let pad = 8 - held;
        out.push(((bits << pad) | ((1 << pad) - 1)) as u8);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbols_code_decodes_to_it() {
        for byte in 0..=255u8 {
            let mut out = Vec::new();
            decode(&encode(&[byte]), &mut out).expect("one symbol");
            assert_eq!(out, [byte]);
        }
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let mut out = Vec::new();
        decode(&encode(&all), &mut out).expect("all symbols");
        assert_eq!(out, all);
    }

    #[test]
    fn rfc_7541_c4_strings_decode() {
        let mut out = Vec::new();
        decode(
            &[
                0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
            ],
            &mut out,
        )
        .expect("C.4.1");
        assert_eq!(out, b"www.example.com");
        out.clear();
        decode(&[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf], &mut out).expect("C.4.2");
        assert_eq!(out, b"no-cache");
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // '0' is 00000 (5 bits): padding of zeros is not EOS's prefix.
        assert_eq!(decode(&[0x00], &mut Vec::new()), Err(HuffmanError::Padding));
        // A whole byte of ones is padding longer than 7 bits.
        assert_eq!(
            decode(&[0x07, 0xff], &mut Vec::new()),
            Err(HuffmanError::Padding)
        );
        // EOS itself: 30 ones.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()),
            Err(HuffmanError::Eos)
        );
        assert_eq!(decode(&[], &mut Vec::new()), Ok(()));
    }
}
