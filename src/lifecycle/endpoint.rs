//! Every listening socket a generation has, whatever its kind, comes from
//! one function, [`listen`] (pingora's `ListenerEndpointBuilder::listen` is
//! the model): adopted by name from what an older generation or systemd
//! passed, if that socket is bound where the config says, else bound
//! afresh (to listen when its user says: [`Listening::listen`]); then held,
//! so a successor is offered it. The admin listener, each listener shard
//! and the control socket take the same path, so none can skip the check
//! an adopted fd gets or be left out of the next offer.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::inventory::{AdoptError, FateCell, Holdings, Inventory};

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
    /// A Unix listener (the control socket, a Unix admin socket).
    Unix(&'a Path),
}

impl Endpoint<'_> {
    /// Whether a socket bound at `local` serves this endpoint (a wanted
    /// port 0 matches any port on the same IP). One that does not is the
    /// config having moved it: it is left to close, a Unix socket where
    /// an address is wanted too (the admin socket moved from `unix:` to an
    /// address). A socket of any other family under a TCP listener's name
    /// is not what the name says.
    pub fn is_at(&self, local: &SockAddr) -> Result<bool, String> {
        match self {
            Endpoint::Tcp { .. } if local.domain() == Domain::UNIX => Ok(false),
            Endpoint::Tcp { addr, .. } => {
                let local = local.as_socket().ok_or("not an inet socket")?;
                Ok(local == *addr || (addr.port() == 0 && local.ip() == addr.ip()))
            }
            Endpoint::Unix(path) => Ok(local.as_pathname() == Some(*path)),
        }
    }

    /// A Unix socket's path.
    fn path(&self) -> Option<&Path> {
        match self {
            Endpoint::Tcp { .. } => None,
            Endpoint::Unix(path) => Some(path),
        }
    }

    /// A connection takes TCP_NODELAY from its listener as its handshake
    /// completes (Linux copies the listener's options then), so it is set
    /// once here rather than by a setsockopt per connection; on adopted
    /// sockets too, since an older version or systemd may have made them
    /// without it. Says whether it lacked it: connections already queued
    /// on it then lack it too.
    fn prepare(&self, socket: &Socket) -> std::io::Result<bool> {
        match self {
            Endpoint::Tcp { .. } => {
                let lacked = !socket.tcp_nodelay()?;
                if lacked {
                    socket.set_tcp_nodelay(true)?;
                }
                Ok(lacked)
            }
            Endpoint::Unix(_) => Ok(false),
        }
    }

    fn bind(&self) -> std::io::Result<Socket> {
        match self {
            Endpoint::Tcp {
                addr, reuseport, ..
            } => bind_tcp(*addr, *reuseport),
            Endpoint::Unix(path) => super::control::bind(path).map(Socket::from),
        }
    }

    fn backlog(&self) -> Option<i32> {
        match self {
            Endpoint::Tcp { backlog, .. } => Some(*backlog),
            Endpoint::Unix(_) => None,
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

/// A socket, adopted or bound, and held for the next offer. One bound
/// here for a TCP endpoint is not listening yet: it takes connections
/// once its user calls [`Listening::listen`] (see there).
pub struct Listening {
    /// Non-blocking; made a `TcpListener` or `UnixListener` by its user.
    pub socket: Socket,
    /// The config's backlog, for a TCP endpoint.
    pub backlog: Option<i32>,
    /// What became of it at this generation's end (see [`Holdings::hold`]).
    pub fate: Arc<FateCell>,
    /// Adopted without TCP_NODELAY: the connections queued before it was
    /// set lack it, so this generation sets it on each one it accepts (a
    /// successor adopts the socket with it, and pays nothing).
    pub nodelay_each: bool,
    /// Taken from the previous generation rather than bound here.
    pub adopted: bool,
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
    let (socket, adopted) = match inventory.take(name, endpoint)? {
        Some(socket) => (socket, true),
        None => (endpoint.bind().map_err(ListenError::Bind)?, false),
    };
    let nodelay_each = endpoint.prepare(&socket).map_err(ListenError::Bind)?;
    let address = endpoint.address_of(&socket).map_err(ListenError::Hold)?;
    let fate = holdings
        .hold(
            name,
            address,
            std::os::fd::AsFd::as_fd(&socket),
            endpoint.path(),
        )
        .map_err(ListenError::Hold)?;
    Ok(Listening {
        socket,
        backlog: endpoint.backlog(),
        fate,
        nodelay_each,
        adopted,
    })
}

impl Listening {
    /// Listens, with the config's backlog. A socket bound here takes no
    /// connection before this: a reload's new generation calls it only as
    /// it starts accepting, so a fresh shard does not join the old
    /// generation's `SO_REUSEPORT` group and queue connections that a
    /// failed reload would then reset. On an adopted socket it applies a
    /// changed backlog (Linux takes `listen` again on a listening socket).
    pub fn listen(&self) -> std::io::Result<()> {
        match self.backlog {
            Some(backlog) => self.socket.listen(backlog),
            None => Ok(()),
        }
    }
}

/// Binds a non-blocking, CLOEXEC socket with SO_REUSEADDR (and SO_REUSEPORT
/// when sharding) and TCP_NODELAY for its connections, to listen later
/// ([`Listening::listen`]); IPv6 sockets are explicitly v6-only.
fn bind_tcp(addr: SocketAddr, reuseport: bool) -> std::io::Result<Socket> {
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
    // Before `listen`: no connection can arrive without it.
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::handoff::SocketEntry;

    fn tcp(addr: SocketAddr) -> Endpoint<'static> {
        Endpoint::Tcp {
            addr,
            backlog: 16,
            reuseport: false,
        }
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    /// A socket listening on loopback, as an older generation hands it.
    fn listening() -> Socket {
        let socket = bind_tcp(addr("127.0.0.1:0"), false).expect("bind");
        socket.listen(16).expect("listen");
        socket
    }

    /// An inventory holding one listening socket on loopback, as `name`.
    fn inherited(name: &str) -> (Inventory, SocketAddr) {
        inventory_of(name, listening())
    }

    /// The same, made the way an older version or systemd (by default)
    /// makes it: without TCP_NODELAY.
    fn inherited_without_nodelay(name: &str) -> (Inventory, SocketAddr) {
        let socket = listening();
        socket.set_tcp_nodelay(false).expect("setsockopt");
        inventory_of(name, socket)
    }

    fn inventory_of(name: &str, socket: Socket) -> (Inventory, SocketAddr) {
        let at = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("inet");
        let entry = SocketEntry {
            name: name.into(),
            addr: at.to_string(),
        };
        let inventory = Inventory::new(vec![entry], vec![socket.into()]).expect("inventory");
        (inventory, at)
    }

    fn bound_at(listening: &Listening) -> SocketAddr {
        listening
            .socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("inet")
    }

    #[test]
    fn a_wanted_port_0_is_any_port_on_the_same_address() {
        let at = SockAddr::from(addr("127.0.0.1:8080"));
        assert_eq!(tcp(addr("127.0.0.1:8080")).is_at(&at), Ok(true));
        assert_eq!(tcp(addr("127.0.0.1:0")).is_at(&at), Ok(true));
        assert_eq!(tcp(addr("127.0.0.1:8081")).is_at(&at), Ok(false));
        assert_eq!(tcp(addr("127.0.0.2:0")).is_at(&at), Ok(false));
        assert_eq!(Endpoint::Unix(Path::new("/run/x")).is_at(&at), Ok(false));
        let unix = SockAddr::unix("/run/x").expect("a path");
        assert_eq!(tcp(addr("127.0.0.1:9901")).is_at(&unix), Ok(false), "moved");
    }

    #[test]
    fn a_socket_inherited_where_the_config_has_it_is_adopted_and_held() {
        let (mut inventory, at) = inherited("web");
        let mut holdings = Holdings::default();
        let listening = listen("web", &tcp(at), &mut inventory, &mut holdings).expect("listen");
        assert_eq!(bound_at(&listening), at);
        assert_eq!(inventory.taken(), ["web"]);
        assert!(inventory.unclaimed().is_empty());
        let offered: Vec<(String, String)> = holdings
            .offer()
            .expect("offer")
            .into_iter()
            .map(|(e, _)| (e.name, e.addr))
            .collect();
        assert_eq!(offered, [("web".to_string(), at.to_string())]);
    }

    /// A renamed socket is claimed under its new name and reported apart
    /// under its old one, once claimed; a name held already is not given.
    #[test]
    fn a_renamed_socket_is_adopted_under_its_new_name_and_its_old_one_reported() {
        let (mut inventory, at) = inherited("web");
        assert!(!inventory.rename("web", "web"), "held already");
        assert!(inventory.rename("web", "www"));
        assert!(inventory.renamed().is_empty(), "not claimed yet");
        let mut holdings = Holdings::default();
        let listening = listen("www", &tcp(at), &mut inventory, &mut holdings).expect("listen");
        assert_eq!(bound_at(&listening), at);
        assert_eq!(inventory.taken(), ["www"]);
        assert_eq!(inventory.renamed(), ["web"]);
        assert!(inventory.unclaimed().is_empty());
    }

    #[test]
    fn a_socket_the_config_moved_is_left_to_close_and_a_new_one_bound() {
        let (mut inventory, at) = inherited("web");
        let mut holdings = Holdings::default();
        let moved = tcp(addr("127.0.0.2:0"));
        let listening = listen("web", &moved, &mut inventory, &mut holdings).expect("listen");
        assert_eq!(bound_at(&listening).ip(), addr("127.0.0.2:0").ip());
        assert_ne!(bound_at(&listening), at);
        assert_eq!(inventory.unclaimed(), ["web"]);
    }

    /// A socket bound here takes no connection until its user says: a
    /// reload's new shard must not queue connections before it accepts.
    #[test]
    fn a_bound_socket_refuses_connections_until_it_listens() {
        let mut holdings = Holdings::default();
        let bound = listen(
            "web",
            &tcp(addr("127.0.0.1:0")),
            &mut Inventory::default(),
            &mut holdings,
        )
        .expect("bind");
        let at = bound_at(&bound);
        assert!(std::net::TcpStream::connect(at).is_err(), "refused");
        bound.listen().expect("listen");
        assert!(std::net::TcpStream::connect(at).is_ok());
    }

    /// The connection path sets TCP_NODELAY per connection only on a socket
    /// adopted without it: every other accepted socket must have it from
    /// its listener, whether bound here or adopted.
    #[test]
    fn connections_accepted_on_a_bound_or_adopted_socket_have_no_delay() {
        let (mut inventory, at) = inherited_without_nodelay("web");
        let mut holdings = Holdings::default();
        let adopted = listen("web", &tcp(at), &mut inventory, &mut holdings).expect("listen");
        assert!(adopted.nodelay_each, "adopted without TCP_NODELAY");
        let bound = listen(
            "api",
            &tcp(addr("127.0.0.1:0")),
            &mut inventory,
            &mut holdings,
        )
        .expect("listen");
        assert!(!bound.nodelay_each);
        for listening in [adopted, bound] {
            listening.listen().expect("listen");
            let _client = std::net::TcpStream::connect(bound_at(&listening)).expect("connect");
            listening.socket.set_nonblocking(false).expect("blocking");
            let (accepted, _) = listening.socket.accept().expect("accept");
            assert!(accepted.tcp_nodelay().expect("getsockopt"));
        }
    }

    /// Why a socket adopted without TCP_NODELAY makes its accept loop set
    /// it on each connection: one already queued took the listener's
    /// options as it was, and setting them now does not reach it. A socket
    /// adopted with it asks for nothing more.
    #[test]
    fn a_connection_queued_before_adoption_keeps_the_old_options() {
        let (mut inventory, at) = inherited_without_nodelay("web");
        let _client = std::net::TcpStream::connect(at).expect("connect");
        let mut holdings = Holdings::default();
        let adopted = listen("web", &tcp(at), &mut inventory, &mut holdings).expect("listen");
        assert!(adopted.nodelay_each);
        adopted.socket.set_nonblocking(false).expect("blocking");
        let (queued, _) = adopted.socket.accept().expect("accept");
        assert!(!queued.tcp_nodelay().expect("getsockopt"));

        let entry = SocketEntry {
            name: "web".into(),
            addr: at.to_string(),
        };
        let mut again =
            Inventory::new(vec![entry], vec![adopted.socket.into()]).expect("inventory");
        let readopted =
            listen("web", &tcp(at), &mut again, &mut Holdings::default()).expect("listen");
        assert!(!readopted.nodelay_each, "adopted with TCP_NODELAY");
    }
}
