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
        acks: Acks,
    },
    /// A Unix listener (the control socket).
    Unix(&'a Path),
}

/// When a listener's connections acknowledge the bytes their clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// At once, for a connection's first segments (the kernel's default).
    Prompt,
    /// With the answer (`TCP_QUICKACK` off on the listening socket, which
    /// its connections inherit): for plain HTTP, where the client speaks
    /// first and the response soon follows, so a new connection's request
    /// costs no ACK of its own, one packet of ten (HAProxy does the same
    /// on its HTTP listeners). The HTTP path asks for prompt ACKs again
    /// whenever it waits for more of a request
    /// (`proxy::h1::io::ack_promptly`): a client holding its next bytes
    /// until the last are acknowledged (Nagle) would wait for the delayed
    /// ACK, 40 ms.
    WithAnswer,
}

/// What an accept loop sets on each connection, because its listening
/// socket came without it (adopted from a generation that set it
/// otherwise): connections inherit these from the listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerConnection {
    /// Adopted without TCP_NODELAY: the connections queued before it was
    /// set lack it (a successor adopts the socket with it, and pays
    /// nothing).
    pub nodelay: bool,
    /// Adopted with delayed ACKs ([`Acks::WithAnswer`]) for a listener that
    /// wants them prompt: a listening socket cannot be turned back (Linux
    /// takes `TCP_QUICKACK` on only on a connected socket), so each
    /// connection is.
    pub prompt_acks: bool,
}

impl PerConnection {
    pub fn apply(self, stream: &tokio::net::TcpStream) {
        if self.nodelay {
            let _ = stream.set_nodelay(true);
        }
        if self.prompt_acks {
            let _ = socket2::SockRef::from(stream).set_tcp_quickack(true);
        }
    }
}

/// Listens on a TCP socket with `backlog`, its connections acknowledging
/// as `acks` says. Again on a listening socket it only changes the
/// backlog.
pub fn listen_tcp(socket: &socket2::SockRef<'_>, backlog: i32, acks: Acks) -> std::io::Result<()> {
    socket.listen(backlog)?;
    // After `listen`, which clears a socket's ACK state as it starts.
    if acks == Acks::WithAnswer {
        socket.set_tcp_quickack(false)?;
    }
    Ok(())
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

    /// A connection takes TCP_NODELAY from its listener as its handshake
    /// completes (Linux copies the listener's options then), so it is set
    /// once here rather than by a setsockopt per connection; on adopted
    /// sockets too, since an older version or systemd may have made them
    /// without it. Says what each connection must be given that the socket
    /// lacks: connections already queued on it lack TCP_NODELAY too, and
    /// delayed ACKs a former generation set cannot be taken off it.
    fn prepare(&self, socket: &Socket) -> std::io::Result<PerConnection> {
        match self {
            Endpoint::Tcp { acks, .. } => {
                let nodelay = !socket.tcp_nodelay()?;
                if nodelay {
                    socket.set_tcp_nodelay(true)?;
                }
                // Reads as on for any socket not set otherwise.
                let prompt_acks = *acks == Acks::Prompt && !socket.tcp_quickack()?;
                Ok(PerConnection {
                    nodelay,
                    prompt_acks,
                })
            }
            Endpoint::Unix(_) => Ok(PerConnection::default()),
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

    fn backlog(&self) -> Option<(i32, Acks)> {
        match self {
            Endpoint::Tcp { backlog, acks, .. } => Some((*backlog, *acks)),
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
    /// The config's backlog and ACKs, for a TCP endpoint.
    pub backlog: Option<(i32, Acks)>,
    /// Turns true if a successor adopts the socket (see [`Holdings::hold`]).
    pub handed_over: Arc<AtomicBool>,
    /// What this generation sets on each connection it accepts.
    pub each: PerConnection,
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
    let each = endpoint.prepare(&socket).map_err(ListenError::Bind)?;
    let address = endpoint.address_of(&socket).map_err(ListenError::Hold)?;
    let handed_over = holdings
        .hold(name, address, std::os::fd::AsFd::as_fd(&socket))
        .map_err(ListenError::Hold)?;
    Ok(Listening {
        socket,
        backlog: endpoint.backlog(),
        handed_over,
        each,
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
            Some((backlog, acks)) => {
                listen_tcp(&socket2::SockRef::from(&self.socket), backlog, acks)
            }
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
            acks: Acks::Prompt,
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
        assert!(adopted.each.nodelay, "adopted without TCP_NODELAY");
        let bound = listen(
            "api",
            &tcp(addr("127.0.0.1:0")),
            &mut inventory,
            &mut holdings,
        )
        .expect("listen");
        assert!(!bound.each.nodelay);
        for listening in [adopted, bound] {
            listening.listen().expect("listen");
            let _client = std::net::TcpStream::connect(bound_at(&listening)).expect("connect");
            listening.socket.set_nonblocking(false).expect("blocking");
            let (accepted, _) = listening.socket.accept().expect("accept");
            assert!(accepted.tcp_nodelay().expect("getsockopt"));
        }
    }

    /// Whether a connection accepted on `listening` starts with prompt ACKs
    /// (Linux reads `TCP_QUICKACK` as "not delaying").
    fn accepts_prompt(listening: &Listening) -> bool {
        let _client = std::net::TcpStream::connect(bound_at(listening)).expect("connect");
        listening.socket.set_nonblocking(false).expect("blocking");
        let (accepted, _) = listening.socket.accept().expect("accept");
        accepted.tcp_quickack().expect("getsockopt")
    }

    /// A plain HTTP listener's connections start delaying their ACKs, from
    /// the listening socket (`listen` clears what was set before it). The
    /// socket keeps that when a later generation adopts it as a TCP-mode
    /// listener, which cannot take it off the socket: that generation asks
    /// for prompt ACKs on each connection instead, and one adopting it as
    /// HTTP again asks for nothing.
    #[test]
    fn delayed_acks_are_a_plain_http_listeners_and_undone_per_connection_after() {
        let endpoint = |at, acks| Endpoint::Tcp {
            addr: at,
            backlog: 16,
            reuseport: false,
            acks,
        };
        let mut holdings = Holdings::default();
        let any = addr("127.0.0.1:0");
        let http = listen(
            "web",
            &endpoint(any, Acks::WithAnswer),
            &mut Inventory::default(),
            &mut holdings,
        )
        .expect("bind");
        http.listen().expect("listen");
        assert!(!accepts_prompt(&http), "delayed");
        let prompt =
            listen("tcp", &tcp(any), &mut Inventory::default(), &mut holdings).expect("bind");
        prompt.listen().expect("listen");
        assert!(accepts_prompt(&prompt));
        assert!(!prompt.each.prompt_acks);

        let at = bound_at(&http);
        let (mut inventory, _) = inventory_of("web", http.socket);
        let as_tcp =
            listen("web", &tcp(at), &mut inventory, &mut Holdings::default()).expect("adopt");
        as_tcp.listen().expect("listen");
        assert!(as_tcp.each.prompt_acks, "set on each connection");
        assert!(!accepts_prompt(&as_tcp), "the socket still delays");
        let (mut inventory, _) = inventory_of("web", as_tcp.socket);
        let as_http = listen(
            "web",
            &endpoint(at, Acks::WithAnswer),
            &mut inventory,
            &mut Holdings::default(),
        )
        .expect("adopt");
        assert_eq!(as_http.each, PerConnection::default());
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
        assert!(adopted.each.nodelay);
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
        assert!(!readopted.each.nodelay, "adopted with TCP_NODELAY");
    }
}
