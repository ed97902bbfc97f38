//! The PROXY protocol (HAProxy's, v1 text and v2 binary): a balancer in
//! front of baton says who the client really is in a header before the
//! client's bytes ([`receive`]), and baton says the same to backends that
//! ask for it ([`send`]). The codec is the `ppp` crate; what is baton's own
//! is the framing on a live socket (never reading past the header), whom
//! to believe, and the addresses every later step uses ([`Origin`]).

pub mod receive;
pub mod send;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Who a connection is from and to: the socket's own ends, or what a
/// trusted PROXY header said they were. Everything after the accept
/// (X-Forwarded-For, logs, `/status`, a PROXY header sent on) reads this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub client: SocketAddr,
    /// The address the client reached, when a header told it; otherwise
    /// the socket's own, asked only if needed (a `getsockname` per
    /// connection is not paid by listeners that never use it).
    pub local: Option<SocketAddr>,
}

/// Which header versions a listener takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    V1,
    V2,
    Any,
}

impl Accept {
    pub fn as_str(self) -> &'static str {
        match self {
            Accept::V1 => "v1",
            Accept::V2 => "v2",
            Accept::Any => "any",
        }
    }
}

/// A PROXY header version baton writes to a pool's backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// A listener's `proxy_protocol`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiveSettings {
    pub accept: Accept,
    /// Peers whose headers are believed; a header from anyone else closes
    /// the connection.
    pub trusted: Vec<Cidr>,
    /// Without a header (from a trusted peer) the connection is closed;
    /// when false, such a client is served under its socket address.
    pub required: bool,
    /// The whole header must arrive within this.
    pub timeout: Duration,
}

impl ReceiveSettings {
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(peer))
    }
}

/// An address block, `10.0.0.0/8` or `::1/128` (a bare address is one
/// host). IPv4-mapped IPv6 peers match IPv4 blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether it holds every address of its family (`0.0.0.0/0`, `::/0`).
    pub fn is_everything(&self) -> bool {
        self.prefix == 0
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u32::from(net).into(), self.prefix, 32)
                    == masked(u32::from(ip).into(), self.prefix, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), self.prefix, 128)
                    == masked(u128::from(ip), self.prefix, 128)
            }
            _ => false,
        }
    }
}

/// `bits` with all but the top `prefix` of its `width` bits cleared.
fn masked(bits: u128, prefix: u8, width: u32) -> u128 {
    let host = width - u32::from(prefix);
    if host >= 128 {
        0
    } else {
        bits >> host << host
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("\"{text}\" is not an address or address/prefix"))?;
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("\"{text}\": the prefix length must be 0 to {width}"))?,
        };
        // An IPv4-mapped block (`::ffff:10.0.0.0/104`, as peers of a
        // dual-stack socket print) is its IPv4 block: peers are matched in
        // their IPv4 form, so kept as IPv6 it would never match.
        match network.to_canonical() {
            IpAddr::V4(v4) if network.is_ipv6() => match prefix.checked_sub(96) {
                Some(prefix) => Ok(Cidr {
                    network: IpAddr::V4(v4),
                    prefix,
                }),
                None => Err(format!(
                    "\"{text}\": an IPv4-mapped block needs a prefix of at least 96 (or write it as IPv4)"
                )),
            },
            _ => Ok(Cidr { network, prefix }),
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// `addr` with an IPv4 address written as IPv6 (`::ffff:192.0.2.7`) as the
/// IPv4 address it is. A socket systemd passes in bound at a bare port or
/// `[::]` takes IPv4 clients so (baton's own IPv6 sockets are v6-only):
/// `X-Forwarded-For`, access logs and PROXY headers then wrote the mapped
/// form, which a backend's trusted-proxy list of IPv4 blocks misses, and
/// which nginx and Envoy write as IPv4 too.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("valid")
    }

    #[test]
    fn blocks_hold_what_they_should() {
        let ip = |t: &str| t.parse::<IpAddr>().expect("ip");
        assert!(cidr("10.0.0.0/8").contains(ip("10.200.3.4")));
        assert!(!cidr("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(cidr("10.0.0.0/8").contains(ip("::ffff:10.1.2.3")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!cidr("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert!(cidr("::1").contains(ip("::1")));
        assert!(!cidr("::1/128").contains(ip("::2")));
        assert!(cidr("2001:db8::/32").contains(ip("2001:db8:ffff::1")));
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        assert!(cidr("127.0.0.1").contains(ip("127.0.0.1")));
        assert!(!cidr("127.0.0.1").contains(ip("127.0.0.2")));
        // IPv4-mapped blocks are their IPv4 blocks.
        assert!(cidr("::ffff:10.0.0.0/104").contains(ip("10.9.8.7")));
        assert!(cidr("::ffff:127.0.0.1").contains(ip("127.0.0.1")));
        assert!(!cidr("::ffff:10.0.0.0/104").contains(ip("11.0.0.1")));
        assert_eq!(cidr("::ffff:10.0.0.0/104").to_string(), "10.0.0.0/8");
    }

    #[test]
    fn bad_blocks_are_refused_with_the_reason() {
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "example.com/8",
            "10.0.0.0/x",
            "",
            "::ffff:10.0.0.0/95",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!(cidr("10.1.0.0/16").to_string(), "10.1.0.0/16");
    }
}
