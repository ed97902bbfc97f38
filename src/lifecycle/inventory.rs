//! Sockets received from a parent generation, waiting to be claimed by name.
//! Each claim checks the fd is what the name says (bound to the expected
//! address, listening, the right type) before anyone accepts on it; sockets
//! nobody claims are closed when the inventory drops (`shutdown()` only
//! at a first start, when systemd passed them: see
//! [`Inventory::stop_listening_unclaimed`]).

use std::os::fd::{AsFd, OwnedFd};

use super::endpoint::Endpoint;
use super::handoff::SocketEntry;

#[derive(Default)]
pub struct Inventory {
    sockets: Vec<(SocketEntry, Option<OwnedFd>)>,
    /// Names claimed so far, reported to the parent in `Ready`.
    taken: Vec<String>,
    /// Sockets given a new name ([`Inventory::rename`]): new name to old.
    former: Vec<(String, String)>,
    /// Old names of renamed sockets claimed so far, reported apart.
    renamed: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("inherited socket \"{name}\" failed its check: {why}")]
pub struct AdoptError {
    pub name: String,
    pub why: String,
}

impl Inventory {
    /// Pairs the offer's entries with the fds that came with it.
    pub fn new(entries: Vec<SocketEntry>, fds: Vec<OwnedFd>) -> Result<Inventory, AdoptError> {
        if entries.len() != fds.len() {
            return Err(AdoptError {
                name: "(offer)".into(),
                why: format!("{} names but {} fds", entries.len(), fds.len()),
            });
        }
        Ok(Inventory {
            sockets: entries.into_iter().zip(fds.into_iter().map(Some)).collect(),
            ..Inventory::default()
        })
    }

    pub fn len(&self) -> usize {
        self.sockets.iter().filter(|(_, fd)| fd.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the unclaimed fds that are sockets `claimed` holds under
    /// another fd: after a restart systemd passes a socket unit's socket
    /// twice, its own and the fd store's copy, both under the listener's
    /// name, and only one is claimed. Left, the copy read as a socket the
    /// config does not name (and stopped listening at a first start, it
    /// reset what queued during the restart). Returns the names such a
    /// copy had that its holder does not (a socket unit's name changed):
    /// the fd store keeps a socket under its first name, so that entry
    /// must leave it.
    pub fn drop_copies_of(&mut self, claimed: &Holdings) -> Vec<String> {
        let mut stale = Vec::new();
        for (entry, fd) in &mut self.sockets {
            let Some(holder) = fd.as_ref().and_then(|fd| claimed.name_of(fd.as_fd())) else {
                continue;
            };
            tracing::debug!(socket = %entry.name, holder, "a second fd of a claimed socket");
            if holder != entry.name {
                stale.push(entry.name.clone());
            }
            *fd = None;
        }
        stale
    }

    /// Stops every socket nobody claimed listening, for every process
    /// holding it: for a first start's, which systemd passed and holds
    /// too. Never for a reload's: the old generation accepts on them
    /// until the handover, and serves their queues after.
    pub fn stop_listening_unclaimed(&self) {
        for (entry, fd) in &self.sockets {
            let Some(fd) = fd else { continue };
            if let Err(err) = socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Read) {
                tracing::warn!(socket = %entry.name, cause = %err, "an unclaimed socket may still listen");
            }
        }
    }

    /// Names of the sockets nobody claimed (yet).
    pub fn unclaimed(&self) -> Vec<String> {
        self.sockets
            .iter()
            .filter(|(_, fd)| fd.is_some())
            .map(|(e, _)| e.name.clone())
            .collect()
    }

    /// Names of the sockets held (not claimed yet) that are bound at
    /// `endpoint`.
    pub fn held_at(&self, endpoint: &Endpoint<'_>) -> Vec<String> {
        self.sockets
            .iter()
            .filter_map(|(e, fd)| {
                let local = socket2::SockRef::from(fd.as_ref()?).local_addr().ok()?;
                endpoint
                    .is_at(&local)
                    .unwrap_or(false)
                    .then(|| e.name.clone())
            })
            .collect()
    }

    /// Gives the held socket `from` the name `to`, for a listener the
    /// config renamed: the new name adopts it. Not when a socket is held
    /// under `to` already (claims go by name). Says whether it did.
    pub fn rename(&mut self, from: &str, to: &str) -> bool {
        if self.position(to).is_some() {
            return false;
        }
        let Some(index) = self.position(from) else {
            return false;
        };
        self.sockets[index].0.name = to.to_string();
        self.former.push((to.to_string(), from.to_string()));
        true
    }

    /// Old names of the renamed sockets claimed so far: the parent closes
    /// its copies as handed over and takes the names out of systemd's fd
    /// store, and so does a first start after a restart.
    pub fn renamed(&self) -> Vec<String> {
        self.renamed.clone()
    }

    /// Names of the sockets claimed so far.
    pub fn taken(&self) -> Vec<String> {
        self.taken.clone()
    }

    fn claim(&mut self, name: &str) -> Option<OwnedFd> {
        self.taken.push(name.to_string());
        if let Some(at) = self.former.iter().position(|(new, _)| new == name) {
            self.renamed.push(self.former.swap_remove(at).1);
        }
        self.sockets
            .iter_mut()
            .find(|(e, fd)| e.name == name && fd.is_some())
            .and_then(|(_, fd)| fd.take())
    }

    /// Claims the listener `name` if it is bound at `endpoint`; a socket of
    /// that name bound elsewhere is left to close (the config moved it).
    pub fn take(
        &mut self,
        name: &str,
        endpoint: &Endpoint<'_>,
    ) -> Result<Option<socket2::Socket>, AdoptError> {
        let Some(index) = self.position(name) else {
            return Ok(None);
        };
        let fail = |why: String| AdoptError {
            name: name.to_string(),
            why,
        };
        let sock = self.peek(index)?;
        let local = sock
            .local_addr()
            .map_err(|e| fail(format!("getsockname: {e}")))?;
        if !endpoint.is_at(&local).map_err(fail)? {
            return Ok(None);
        }
        check_listening(&sock, socket2::Type::STREAM).map_err(fail)?;
        let fd = self.claim(name).ok_or_else(|| fail("taken twice".into()))?;
        let sock = socket2::Socket::from(fd);
        sock.set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        Ok(Some(sock))
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.sockets
            .iter()
            .position(|(e, fd)| e.name == name && fd.is_some())
    }

    fn peek(&self, index: usize) -> Result<socket2::SockRef<'_>, AdoptError> {
        match &self.sockets[index] {
            (_, Some(fd)) => Ok(socket2::SockRef::from(fd)),
            (e, None) => Err(AdoptError {
                name: e.name.clone(),
                why: "already taken".into(),
            }),
        }
    }
}

fn check_listening(sock: &socket2::SockRef<'_>, want: socket2::Type) -> Result<(), String> {
    match sock.r#type() {
        Ok(t) if t == want => {}
        Ok(t) => return Err(format!("socket type {t:?}")),
        Err(e) => return Err(format!("SO_TYPE: {e}")),
    }
    match sock.is_listener() {
        Ok(true) => Ok(()),
        Ok(false) => Err("not listening (SO_ACCEPTCONN is 0)".into()),
        Err(e) => Err(format!("SO_ACCEPTCONN: {e}")),
    }
}

/// The sockets this generation would offer a successor: a duplicate of each
/// listening fd, with its [`Fate`], which its accept loop reads when it
/// stops.
#[derive(Default)]
pub struct Holdings {
    items: Vec<Holding>,
}

struct Holding {
    entry: SocketEntry,
    fd: OwnedFd,
    fate: std::sync::Arc<FateCell>,
    /// A Unix socket's file, as it was when held.
    file: Option<SocketFile>,
}

/// The file a Unix socket is bound at: its path, and which file was there
/// (device and inode), so a path another socket was bound at since is
/// never removed in its place.
struct SocketFile {
    path: std::path::PathBuf,
    identity: (u64, u64),
}

impl SocketFile {
    fn of(path: &std::path::Path) -> Option<SocketFile> {
        Some(SocketFile {
            path: path.to_path_buf(),
            identity: socket_identity(path)?,
        })
    }
}

/// The device and inode an fd refers to: one socket's, through every fd
/// that refers to it (dup'ed, or passed over a Unix socket).
fn fd_identity(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u64, u64)> {
    let stat = nix::sys::stat::fstat(fd).ok()?;
    Some((stat.st_dev, stat.st_ino))
}

/// The device and inode of the socket file at `path` (not followed).
fn socket_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type()
        .is_socket()
        .then(|| (meta.dev(), meta.ino()))
}

/// What becomes of a held socket when this generation closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fate {
    /// No successor took over (a stop): this generation serves its queue
    /// and closes it. It keeps listening if systemd holds it (a socket
    /// unit, or the fd store across a restart): the next start serves it.
    Kept = 0,
    /// A successor adopted it: it lives on there.
    Adopted = 1,
    /// A reload's config no longer names it: its queue is served, then it
    /// stops listening for every holder. A copy systemd holds (a socket
    /// unit's, or the fd store's until the successor's removal lands) would
    /// go on queueing connections nobody accepts.
    Dropped = 2,
}

/// A socket's [`Fate`], set by the lifecycle at a handover or a stop and
/// read by its accept loop as it ends.
#[derive(Debug, Default)]
pub struct FateCell(std::sync::atomic::AtomicU8);

impl FateCell {
    fn set(&self, fate: Fate) {
        self.0
            .store(fate as u8, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn get(&self) -> Fate {
        match self.0.load(std::sync::atomic::Ordering::SeqCst) {
            1 => Fate::Adopted,
            2 => Fate::Dropped,
            _ => Fate::Kept,
        }
    }
}

impl Holdings {
    /// Keeps a duplicate of `fd` under `name`, and for a Unix socket which
    /// file at `path` it is bound at; the returned cell says, once this
    /// generation ends, what became of it.
    pub fn hold(
        &mut self,
        name: &str,
        addr: String,
        fd: std::os::fd::BorrowedFd<'_>,
        path: Option<&std::path::Path>,
    ) -> std::io::Result<std::sync::Arc<FateCell>> {
        let fate = std::sync::Arc::new(FateCell::default());
        self.items.push(Holding {
            entry: SocketEntry {
                name: name.to_string(),
                addr,
            },
            fd: fd.try_clone_to_owned()?,
            fate: std::sync::Arc::clone(&fate),
            file: path.and_then(SocketFile::of),
        });
        Ok(fate)
    }

    /// Removes the file of each held Unix socket the successor did not
    /// adopt (its config moved the admin or control socket elsewhere):
    /// once this generation has gone nothing answers there. Only while
    /// the path is still the file this generation held; after
    /// [`Holdings::handed_over`]. Not under systemd, whose socket unit
    /// may own the path (see `Generation::retire`).
    pub fn remove_unadopted_files(&self) {
        let unadopted = self.items.iter().filter(|h| h.fate.get() != Fate::Adopted);
        for file in unadopted.filter_map(|h| h.file.as_ref()) {
            if socket_identity(&file.path) != Some(file.identity) {
                continue;
            }
            match std::fs::remove_file(&file.path) {
                Ok(()) => {
                    tracing::info!(path = %file.path.display(), "removed a socket the config moved elsewhere")
                }
                Err(err) => {
                    tracing::debug!(path = %file.path.display(), cause = %err, "moved socket not removed")
                }
            }
        }
    }

    /// The name `fd` is held under, if it is one of the held sockets (the
    /// same kernel socket, whichever fd refers to it).
    pub fn name_of(&self, fd: std::os::fd::BorrowedFd<'_>) -> Option<&str> {
        let wanted = fd_identity(fd)?;
        self.items
            .iter()
            .find(|h| fd_identity(h.fd.as_fd()) == Some(wanted))
            .map(|h| h.entry.name.as_str())
    }

    /// Fresh duplicates of every held socket, for one offer.
    pub fn offer(&self) -> std::io::Result<Vec<(SocketEntry, OwnedFd)>> {
        self.items
            .iter()
            .map(|h| Ok((h.entry.clone(), h.fd.try_clone()?)))
            .collect()
    }

    /// A duplicate of every held socket, by name.
    pub fn duplicates(&self) -> std::io::Result<Vec<(String, OwnedFd)>> {
        self.items
            .iter()
            .map(|h| Ok((h.entry.name.clone(), h.fd.try_clone()?)))
            .collect()
    }

    /// The name of every held socket.
    pub fn names(&self) -> Vec<String> {
        self.items.iter().map(|h| h.entry.name.clone()).collect()
    }

    /// Stops every held listening socket deferring its connections'
    /// accepts (`TCP_DEFER_ACCEPT`). A connection the kernel holds back
    /// until its client's first bytes is in no accept queue: closing the
    /// socket then would reset it as its request comes.
    pub fn stop_deferring(&self) {
        for h in &self.items {
            crate::defer_accept::stop_deferring(h.fd.as_fd());
        }
    }

    /// Marks the sockets a reload's successor adopted, and the others as
    /// dropped by its config when it `names_every_socket` (else as kept:
    /// closed, not stopped listening, as one it took unnamed may be among
    /// them).
    pub fn handed_over(&self, adopted: &[String], names_every_socket: bool) {
        for h in &self.items {
            h.fate.set(if adopted.contains(&h.entry.name) {
                Fate::Adopted
            } else if names_every_socket {
                Fate::Dropped
            } else {
                Fate::Kept
            });
        }
    }

    /// Marks every socket as kept by this generation to its end (a stop).
    pub fn kept(&self) {
        for h in &self.items {
            h.fate.set(Fate::Kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::Holdings;
    use crate::defer_accept::{defers_accept, set_defer_accept};

    /// Of the held Unix sockets, only the file of one the successor did
    /// not adopt goes, and only while it is still that socket's file: a
    /// socket bound at the path since keeps it.
    #[test]
    fn only_an_unadopted_sockets_own_file_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = |name: &str| dir.path().join(name);
        let bind = |name: &str| std::os::unix::net::UnixListener::bind(path(name)).expect("bind");
        let (adopted, moved, rebound) = (bind("adopted"), bind("moved"), bind("rebound"));
        let mut holdings = Holdings::default();
        for (name, socket) in [
            ("adopted", &adopted),
            ("moved", &moved),
            ("rebound", &rebound),
        ] {
            holdings
                .hold(name, String::new(), socket.as_fd(), Some(&path(name)))
                .expect("hold");
        }
        std::fs::remove_file(path("rebound")).expect("unlink");
        let _since = bind("rebound");
        holdings.handed_over(&["adopted".to_string()], true);
        holdings.remove_unadopted_files();
        assert!(path("adopted").exists(), "the adopted socket's file");
        assert!(!path("moved").exists(), "the moved socket's file");
        assert!(path("rebound").exists(), "the file of a socket bound since");
    }

    /// A stop ends the deferral on every held socket, not only the first:
    /// a shard left deferring would reset the connections it held back.
    #[test]
    fn a_stop_ends_the_deferral_on_every_held_socket() {
        let sockets: Vec<std::net::TcpListener> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let mut holdings = Holdings::default();
        for (i, socket) in sockets.iter().enumerate() {
            set_defer_accept(socket.as_fd(), true).expect("set");
            let addr = socket.local_addr().expect("addr").to_string();
            holdings
                .hold(&format!("web/{i}"), addr, socket.as_fd(), None)
                .expect("hold");
        }
        holdings.stop_deferring();
        for socket in &sockets {
            assert!(!defers_accept(socket.as_fd()), "{socket:?} still defers");
        }
    }
}
