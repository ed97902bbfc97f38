//! The identity a client proved with its certificate, as backends read it:
//! one element of Envoy's `x-forwarded-client-cert` (XFCC), the field
//! Envoy, Istio and the service meshes' backends read:
//! `Hash=<SHA-256 of the certificate's DER, hex>;Subject="<subject, RFC
//! 4514>";URI=<each URI name>;DNS=<each DNS name>`. Made once per
//! connection, from a certificate the handshake verified against
//! `client_ca` (rustls never hands over one it did not).

use std::fmt::Write;

use ring::digest::{digest, SHA256};
use x509_parser::asn1_rs::ToDer;
use x509_parser::extensions::GeneralName;
use x509_parser::objects::{oid2abbrev, oid_registry};
use x509_parser::x509::X509Name;

/// The XFCC element for the client certificate `der`: always its hash, and
/// its names when its DER parses (rustls verified it, so it does), in the
/// certificate's order. Every byte is visible ASCII or a space, never
/// first or last: it goes into a header field as it is.
pub fn forwarded_client_cert(der: &[u8]) -> String {
    let mut element = String::from("Hash=");
    for byte in digest(&SHA256, der).as_ref() {
        let _ = write!(element, "{byte:02x}");
    }
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return element;
    };
    element.push_str(";Subject=\"");
    put_name(cert.subject(), &mut element);
    element.push('"');
    let names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.clone())
        .unwrap_or_default();
    for name in &names {
        let (key, value) = match name {
            GeneralName::URI(uri) => ("URI", uri),
            GeneralName::DNSName(dns) => ("DNS", dns),
            _ => continue,
        };
        let _ = write!(element, ";{key}=");
        put_plain(value, &mut element);
    }
    element
}

/// The first common name (CN) of the client certificate `der`'s subject,
/// if it has one as text: what HAProxy's `send-proxy-v2-ssl-cn` tells.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// A distinguished name as RFC 4514 writes it (last RDN first, `,`
/// between RDNs, `+` within one), each value escaped so that neither the
/// quotes around it nor a header field can be broken by it.
fn put_name(name: &X509Name<'_>, out: &mut String) {
    let rdns: Vec<_> = name.iter_rdn().collect();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, attribute) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            let oid = attribute.attr_type();
            match oid2abbrev(oid, oid_registry()) {
                // As OpenSSL and Envoy name it.
                Ok("Email") => out.push_str("emailAddress"),
                Ok(short) => out.push_str(short),
                Err(_) => out.push_str(&oid.to_id_string()),
            }
            out.push('=');
            match attribute.as_str() {
                Ok(text) => put_value(text, out),
                // A type x509-parser reads as no text (BMPString,
                // TeletexString, ...): RFC 4514's `#` and the hex of the
                // value's whole encoding, its tag and length included (its
                // content alone could be read as another value).
                Err(_) => {
                    out.push('#');
                    let der = attribute.attr_value().to_der_vec().unwrap_or_default();
                    for byte in der {
                        let _ = write!(out, "{byte:02x}");
                    }
                }
            }
        }
    }
}

/// One attribute value, RFC 4514-escaped: its special characters with a
/// backslash, and any byte outside visible ASCII (a space excepted) as
/// `\HH`, as are `"` and `\` (`\22`, `\5C`): a reader that finds the
/// closing quote with or without quoted-pairs finds the right one.
fn put_value(text: &str, out: &mut String) {
    let last = text.len().saturating_sub(1);
    for (i, byte) in text.bytes().enumerate() {
        let special = matches!(byte, b'+' | b',' | b';' | b'<' | b'>')
            || (i == 0 && matches!(byte, b'#' | b' '))
            || (i == last && byte == b' ');
        if special {
            out.push('\\');
            out.push(char::from(byte));
        } else if (byte.is_ascii_graphic() && !matches!(byte, b'"' | b'\\')) || byte == b' ' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "\\{byte:02X}");
        }
    }
}

/// A URI or DNS name, unquoted as Envoy writes them: a byte that would end
/// the element or the field (`,` `;` `"` `=`, or one outside visible
/// ASCII) is percent-encoded, and so is `%`, so that a reader decoding
/// once gets the name back.
fn put_plain(text: &str, out: &mut String) {
    for byte in text.bytes() {
        if byte.is_ascii_graphic() && !matches!(byte, b',' | b';' | b'"' | b'=' | b'%') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair, SanType};

    fn certificate(subject: &[(DnType, &str)], sans: Vec<SanType>) -> Vec<u8> {
        let mut name = DistinguishedName::new();
        for (kind, value) in subject {
            name.push(kind.clone(), *value);
        }
        certificate_named(name, sans)
    }

    fn certificate_named(name: DistinguishedName, sans: Vec<SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name;
        params.subject_alt_names = sans;
        let key = KeyPair::generate().expect("key");
        params
            .self_signed(&key)
            .expect("certificate")
            .der()
            .to_vec()
    }

    #[test]
    fn an_element_names_the_hash_the_subject_and_each_uri_and_dns_name() {
        let der = certificate(
            &[
                (DnType::OrganizationName, "Acme"),
                (DnType::CommonName, "client.test"),
            ],
            vec![
                SanType::URI("spiffe://acme/web".try_into().expect("uri")),
                SanType::DnsName("client.test".try_into().expect("dns")),
                SanType::DnsName("other.test".try_into().expect("dns")),
            ],
        );
        let hash: String = digest(&SHA256, &der)
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            forwarded_client_cert(&der),
            format!(
                "Hash={hash};Subject=\"CN=client.test,O=Acme\";URI=spiffe://acme/web;DNS=client.test;DNS=other.test"
            )
        );
    }

    /// A value of a type with no text here (a BMPString) is RFC 4514's
    /// `#` and its whole encoding, tag and length with the content: the
    /// content alone could read as another value.
    #[test]
    fn a_value_without_text_is_written_whole_in_hex() {
        let mut name = DistinguishedName::new();
        let bmp = rcgen::string::BmpString::try_from("ab").expect("bmp");
        name.push(DnType::CommonName, DnValue::BmpString(bmp));
        let element = forwarded_client_cert(&certificate_named(name, Vec::new()));
        assert!(
            element.ends_with(";Subject=\"CN=#1e0400610062\""),
            "{element}"
        );
    }

    /// A subject or a name made to break out of its quotes or its field
    /// (a quote, a `;`, a CR LF, non-ASCII) stays inside them.
    #[test]
    fn hostile_names_stay_inside_their_element() {
        let der = certificate(
            &[(DnType::CommonName, "a\"; Hash=00,\r\nx: é \\")],
            vec![SanType::URI("spiffe://a/b;c,d%3B".try_into().expect("uri"))],
        );
        let element = forwarded_client_cert(&der);
        let subject = element
            .split_once(";Subject=")
            .map(|(_, rest)| rest)
            .expect("subject");
        assert_eq!(
            subject,
            "\"CN=a\\22\\; Hash=00\\,\\0D\\0Ax: \\C3\\A9 \\5C\";URI=spiffe://a/b%3Bc%2Cd%253B"
        );
        assert!(element.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
    }
}
