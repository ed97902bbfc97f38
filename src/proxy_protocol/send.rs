//! A pool's side (`send_proxy`): the header baton writes first on a new
//! backend connection. A connection that carried one speaks for one client
//! only, so callers never pool it for another (nghttp2 #604: a shared
//! connection with one client's header misattributes every other client).
//! Health checks send `LOCAL` (v2) or `UNKNOWN` (v1): no client to name.

use std::net::{IpAddr, SocketAddr};

use ppp::v2;

use super::{Origin, Version};
use crate::stream::ByteStream;

/// Whom a backend connection speaks for: what its PROXY header says,
/// taken from the client's connection once.
#[derive(Debug, Clone)]
pub struct Speaker {
    client: SocketAddr,
    local: SocketAddr,
    alpn: Option<Box<[u8]>>,
    authority: Option<Box<str>>,
    /// `PP2_TYPE_SSL`'s value, for a client over TLS.
    ssl: Option<Box<[u8]>>,
}

impl Speaker {
    /// The client of `stream`, as `origin` has it. The address it reached
    /// is the socket's own unless a PROXY header said otherwise.
    pub fn of<S: ByteStream>(stream: &S, origin: Origin) -> Speaker {
        let local = origin
            .local
            .or_else(|| stream.tcp().local_addr().ok().map(super::canonical))
            .unwrap_or(origin.client);
        Speaker {
            client: origin.client,
            local,
            alpn: stream.alpn().map(Box::from),
            authority: stream.server_name().map(Box::from),
            ssl: stream
                .tls_version()
                .map(|version| ssl_value(version, stream.client_certificate(), stream.resumed()))
                .map(Vec::into_boxed_slice),
        }
    }

    /// The header for one backend connection; `unique_id` is the request
    /// id baton logs for the exchange (or connection) that opened it.
    pub fn header(&self, version: Version, unique_id: &str) -> Vec<u8> {
        header(
            version,
            self.client,
            self.local,
            Extras {
                alpn: self.alpn.as_deref(),
                authority: self.authority.as_deref(),
                unique_id: Some(unique_id),
                ssl: self.ssl.as_deref(),
            },
        )
    }
}

/// What a v2 header carries beyond the addresses (v1 has no room for it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Extras<'a> {
    /// The protocol the client's TLS handshake agreed on.
    pub alpn: Option<&'a [u8]>,
    /// The name the client asked for in its TLS handshake (SNI).
    pub authority: Option<&'a str>,
    /// The request id baton logs for this exchange (at most 128 bytes).
    pub unique_id: Option<&'a str>,
    /// `PP2_TYPE_SSL`'s value (see `ssl_value`), for a client over TLS.
    pub ssl: Option<&'a [u8]>,
}

/// `PP2_TYPE_SSL`'s client flags and sub-types (the PROXY protocol's
/// spec, 2.2.5).
const PP2_CLIENT_SSL: u8 = 0x01;
const PP2_CLIENT_CERT_CONN: u8 = 0x02;
const PP2_CLIENT_CERT_SESS: u8 = 0x04;
const PP2_SUBTYPE_SSL_VERSION: u8 = 0x21;
const PP2_SUBTYPE_SSL_CN: u8 = 0x22;

/// What a client's TLS session tells a backend, as HAProxy's
/// `send-proxy-v2-ssl-cn` does: the client spoke TLS; whether it presented
/// a certificate on this connection (a full handshake) and in its session
/// (a resumed one carries the certificate it was sealed with); `verify`
/// 0, since rustls admits no certificate that failed `client_ca`; the TLS
/// `version`; and the `certificate`'s common name, if any.
fn ssl_value(version: &str, certificate: Option<&[u8]>, resumed: bool) -> Vec<u8> {
    let mut flags = PP2_CLIENT_SSL;
    if certificate.is_some() {
        flags |= PP2_CLIENT_CERT_SESS;
        if !resumed {
            flags |= PP2_CLIENT_CERT_CONN;
        }
    }
    let mut value = vec![flags, 0, 0, 0, 0];
    put_sub_tlv(PP2_SUBTYPE_SSL_VERSION, version.as_bytes(), &mut value);
    let cn = certificate
        .and_then(crate::tls::identity::common_name)
        .filter(|cn| cn.len() <= LONGEST_CN);
    if let Some(cn) = cn {
        put_sub_tlv(PP2_SUBTYPE_SSL_CN, cn.as_bytes(), &mut value);
    }
    value
}

/// The longest common name a header tells (X.509's bound is 64
/// characters). One longer is left out, not cut to a name it is not: the
/// whole header shares one 64 KiB length, and a header that did not fit
/// would not be written at all.
const LONGEST_CN: usize = 1024;

/// One TLV inside `PP2_TYPE_SSL`: its type, its length (two bytes, big
/// endian) and its value (a version name, or a CN of at most
/// `LONGEST_CN`).
fn put_sub_tlv(kind: u8, value: &[u8], out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(&u16::try_from(value.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(value);
}

/// The header for a connection from `client` that reached `local`.
pub fn header(version: Version, client: SocketAddr, local: SocketAddr, extras: Extras) -> Vec<u8> {
    let (client, local) = same_family(client, local);
    match version {
        Version::V1 => {
            let family = if client.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {family} {} {} {} {}\r\n",
                client.ip(),
                local.ip(),
                client.port(),
                local.port()
            )
            .into_bytes()
        }
        Version::V2 => {
            let mut tlvs: Vec<(v2::Type, &[u8])> = Vec::new();
            if let Some(alpn) = extras.alpn {
                tlvs.push((v2::Type::ALPN, alpn));
            }
            if let Some(name) = extras.authority {
                tlvs.push((v2::Type::Authority, name.as_bytes()));
            }
            if let Some(id) = extras.unique_id.filter(|id| id.len() <= 128) {
                tlvs.push((v2::Type::UniqueId, id.as_bytes()));
            }
            if let Some(ssl) = extras.ssl {
                tlvs.push((v2::Type::SSL, ssl));
            }
            binary(
                v2::Builder::with_addresses(
                    v2::Version::Two | v2::Command::Proxy,
                    v2::Protocol::Stream,
                    (client, local),
                ),
                &tlvs,
            )
        }
    }
}

/// The header of a connection on baton's own behalf (a health check).
pub fn local(version: Version) -> Vec<u8> {
    match version {
        Version::V1 => b"PROXY UNKNOWN\r\n".to_vec(),
        Version::V2 => binary(
            v2::Builder::new(
                v2::Version::Two | v2::Command::Local,
                v2::AddressFamily::Unspecified | v2::Protocol::Unspecified,
            ),
            &[],
        ),
    }
}

/// Writes the TLVs and the length. `ppp` refuses only a payload over the
/// format's 64 KiB and these are far below it (a name, an ALPN id, 128
/// bytes of id); were it to refuse, no header at all would be written,
/// and a backend that requires one refuses the connection rather than
/// take it for another client's.
fn binary(mut builder: v2::Builder, tlvs: &[(v2::Type, &[u8])]) -> Vec<u8> {
    for (kind, value) in tlvs {
        builder = match builder.write_tlv(*kind, value) {
            Ok(b) => b,
            Err(_) => return Vec::new(),
        };
    }
    builder.build().unwrap_or_default()
}

/// Both ends in one family, as the header needs: an IPv4 end beside an
/// IPv6 one is written as IPv4-mapped IPv6.
fn same_family(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    let six = |s: SocketAddr| match s.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), s.port()),
        IpAddr::V6(_) => s,
    };
    if a.is_ipv4() == b.is_ipv4() {
        (a, b)
    } else {
        (six(a), six(b))
    }
}

#[cfg(test)]
mod tests {
    use super::super::receive::{decode, frame, Framed};
    use super::super::Accept;
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("addr")
    }

    #[test]
    fn what_is_sent_reads_back_the_same() {
        let (client, local) = (addr("192.0.2.7:40000"), addr("10.0.0.1:443"));
        let extras = Extras {
            alpn: Some(b"h2"),
            authority: Some("app.example.com"),
            unique_id: Some("1f-2a"),
            ssl: Some(&[PP2_CLIENT_SSL, 0, 0, 0, 0]),
        };
        for version in [Version::V1, Version::V2] {
            let bytes = header(version, client, local, extras);
            assert_eq!(frame(&bytes), Framed::Header(bytes.len()));
            assert_eq!(decode(&bytes, Accept::Any), Ok(Some((client, local))));
        }
        let v1 = header(Version::V1, client, local, extras);
        assert_eq!(v1, b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 443\r\n");
    }

    #[test]
    fn v2_carries_alpn_authority_the_request_id_and_tls() {
        let bytes = header(
            Version::V2,
            addr("192.0.2.7:1"),
            addr("10.0.0.1:2"),
            Extras {
                alpn: Some(b"http/1.1"),
                authority: Some("a.example"),
                unique_id: Some("abc-1"),
                ssl: Some(b"\x01\0\0\0\0"),
            },
        );
        let parsed = v2::Header::try_from(bytes.as_slice()).expect("parses");
        let tlvs: Vec<(u8, Vec<u8>)> = parsed
            .tlvs()
            .map(|t| t.expect("tlv"))
            .map(|t| (t.kind, t.value.to_vec()))
            .collect();
        assert_eq!(
            tlvs,
            vec![
                (0x01, b"http/1.1".to_vec()),
                (0x02, b"a.example".to_vec()),
                (0x05, b"abc-1".to_vec()),
                (0x20, b"\x01\0\0\0\0".to_vec())
            ]
        );
    }

    /// A certificate's CN goes in up to `LONGEST_CN` bytes; a longer one
    /// is left out whole (cut, it would name someone else; kept, it could
    /// take the header past its 64 KiB and leave the connection without
    /// one).
    #[test]
    fn a_common_name_too_long_is_left_out_whole() {
        let with_cn = |cn: &str| {
            let mut params = rcgen::CertificateParams::default();
            let mut name = rcgen::DistinguishedName::new();
            name.push(rcgen::DnType::CommonName, cn);
            params.distinguished_name = name;
            let key = rcgen::KeyPair::generate().expect("key");
            let der = params
                .self_signed(&key)
                .expect("certificate")
                .der()
                .to_vec();
            ssl_value("TLSv1.3", Some(&der), false)
        };
        let short = with_cn("client");
        assert_eq!(short.first(), Some(&0x07));
        assert!(short.ends_with(b"\x22\0\x06client"), "{short:?}");
        let long = with_cn(&"x".repeat(LONGEST_CN + 1));
        assert_eq!(long, b"\x07\0\0\0\0\x21\0\x07TLSv1.3");
    }

    #[test]
    fn mixed_families_are_written_as_ipv6() {
        let bytes = header(
            Version::V1,
            addr("192.0.2.7:1"),
            addr("[2001:db8::1]:2"),
            Extras::default(),
        );
        assert_eq!(bytes, b"PROXY TCP6 ::ffff:192.0.2.7 2001:db8::1 1 2\r\n");
    }

    #[test]
    fn health_checks_say_local() {
        assert_eq!(decode(&local(Version::V2), Accept::Any), Ok(None));
        assert_eq!(decode(&local(Version::V1), Accept::Any), Ok(None));
    }
}
