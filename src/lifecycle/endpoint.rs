//! Every listening socket a generation has, whatever its kind, comes from
//! one function, [`listen`] (pingora's `ListenerEndpointBuilder::listen` is
//! the model): adopted by name from what an older generation or systemd
//! passed, if that socket is bound where the config says, else bound
//! afresh; then held, so a successor is offered it. The admin listener, each
//! listener shard and the control socket take the same path, so none can
//! skip the check an adopted fd gets or be left out of the next offer.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::inventory::{AdoptError, Holdings, Inventory};

/// Where a listening socket is bound, and how to bind it afresh.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint<'a> {
    /// A TCP listener; `reuseport` lets shards of one listener share the
    /// address.
    Tcp {
        addr: SocketAddr,
        backlog: i32,
        reuseport: bool,
    },
    /// A Unix listener (the control socket).
    Unix(&'a Path),
}

impl Endpoint<'_> {
    /// Whether a socket bound at `local` serves this endpoint (a wanted
    /// port 0 matches any port on the same IP). One that does not is the
    /// config having moved it: it is left to close. A socket of another
    /// family under a TCP listener's name is not what the name says.
    pub fn is_at(&self, local: &SockAddr) -> Result<bool, String> {
        match self {
            Endpoint::Tcp { addr, .. } => {
                let local = local.as_socket().ok_or("not an inet socket")?;
                Ok(local == *addr || (addr.port() == 0 && local.ip() == addr.ip()))
            }
            Endpoint::Unix(path) => Ok(local.as_pathname() == Some(*path)),
        }
    }

    fn bind(&self) -> std::io::Result<Socket> {
        match self {
            Endpoint::Tcp {
                addr,
                backlog,
                reuseport,
            } => bind_tcp(*addr, *backlog, *reuseport),
            Endpoint::Unix(path) => super::control::bind(path).map(Socket::from),
        }
    }

    /// The address a held socket is offered under: the port a TCP socket
    /// really got, a Unix socket's path.
    fn address_of(&self, socket: &Socket) -> std::io::Result<String> {
        match self {
            Endpoint::Tcp { .. } => socket
                .local_addr()?
                .as_socket()
                .map(|a| a.to_string())
                .ok_or_else(|| std::io::Error::other("not an inet socket")),
            Endpoint::Unix(path) => Ok(path.display().to_string()),
        }
    }
}

/// A listening socket, adopted or bound, and held for the next offer.
pub struct Listening {
    /// Non-blocking; made a `TcpListener` or `UnixListener` by its user.
    pub socket: Socket,
    /// Turns true if a successor adopts the socket (see [`Holdings::hold`]).
    pub handed_over: Arc<AtomicBool>,
}

/// Why a socket could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// An inherited socket of that name failed its check.
    #[error(transparent)]
    Adopt(#[from] AdoptError),
    /// Nothing to adopt, and binding afresh failed.
    #[error("{0}")]
    Bind(std::io::Error),
    /// Bound or adopted, but it could not be held for the next offer.
    #[error("{0}")]
    Hold(std::io::Error),
}

/// The socket `name` at `endpoint`: adopted from `inventory` if it holds a
/// matching one, else bound; either way recorded in `holdings`.
pub fn listen(
    name: &str,
    endpoint: &Endpoint<'_>,
    inventory: &mut Inventory,
    holdings: &mut Holdings,
) -> Result<Listening, ListenError> {
    let socket = match inventory.take(name, endpoint)? {
        Some(adopted) => adopted,
        None => endpoint.bind().map_err(ListenError::Bind)?,
    };
    let address = endpoint.address_of(&socket).map_err(ListenError::Hold)?;
    let handed_over = holdings
        .hold(name, address, std::os::fd::AsFd::as_fd(&socket))
        .map_err(ListenError::Hold)?;
    Ok(Listening {
        socket,
        handed_over,
    })
}

/// Binds a non-blocking, CLOEXEC listening socket with SO_REUSEADDR (and
/// SO_REUSEPORT when sharding); IPv6 sockets are explicitly v6-only.
fn bind_tcp(addr: SocketAddr, backlog: i32, reuseport: bool) -> std::io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if reuseport {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket)
}
