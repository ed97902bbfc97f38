//! Session-ticket keys that outlive a reload. rustls' own ticketer makes
//! its keys at random in each process, so every reload would send every
//! returning client through a full handshake (the complaint users of
//! Envoy, Traefik and Apache have had for years). baton makes the keys
//! itself, keeps them in memory only, rotates them, and hands them to the
//! next generation over the handoff channel: a client that resumed before
//! a reload resumes after it.
//!
//! Three keys live at once: the *current* one seals new tickets; the
//! *previous* one still opens tickets sealed before the last rotation; the
//! *next* one is made a period ahead, so a ticket from a generation that
//! already rotated opens here too. A ticket therefore lives two periods at
//! most. A ticket is `key name (16) | nonce (12) | AES-256-GCM(state)`;
//! the key name is public, the secrets never leave memory and the
//! handoff (not in logs, `/status` or metrics: `Debug` prints no secret).
//!
//! Every ticket is bound to its listener's [`Scope`] (the listener's name
//! and its client-certificate policy) as associated data. rustls resumes
//! a ticket with the client identity it recorded, and asks for no
//! certificate on a resumed handshake; so a ticket one listener sealed
//! opens on no other, nor after a reload that changed the listener's
//! client CAs or `client_auth` (HAProxy's keys are per `bind` for the
//! same reason).

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::digest::{Context as Digest, SHA256, SHA256_OUTPUT_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

const NAME_LEN: usize = 16;
const SECRET_LEN: usize = 32;

/// One key: the name every ticket it sealed carries, and its secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketKey {
    name: [u8; NAME_LEN],
    secret: [u8; SECRET_LEN],
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketKey(..)")
    }
}

impl TicketKey {
    fn generate(rng: &SystemRandom) -> Result<TicketKey, TicketError> {
        let mut key = TicketKey {
            name: [0; NAME_LEN],
            secret: [0; SECRET_LEN],
        };
        rng.fill(&mut key.name).map_err(|_| TicketError::Random)?;
        rng.fill(&mut key.secret).map_err(|_| TicketError::Random)?;
        Ok(key)
    }

    fn sealing(&self) -> Result<LessSafeKey, TicketError> {
        UnboundKey::new(&AES_256_GCM, &self.secret)
            .map(LessSafeKey::new)
            .map_err(|_| TicketError::Key)
    }
}

/// The key set, as the handoff carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketKeys {
    previous: TicketKey,
    current: TicketKey,
    next: TicketKey,
    /// When `current` became current, in Unix seconds: the rotation
    /// schedule goes on across generations instead of restarting.
    current_since: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    #[error("the system random source failed")]
    Random,
    #[error("a ticket key was refused by the cipher")]
    Key,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl TicketKeys {
    /// A fresh set (a first start, or a predecessor that sent none).
    pub fn generate() -> Result<TicketKeys, TicketError> {
        let rng = SystemRandom::new();
        Ok(TicketKeys {
            previous: TicketKey::generate(&rng)?,
            current: TicketKey::generate(&rng)?,
            next: TicketKey::generate(&rng)?,
            current_since: unix_now(),
        })
    }

    /// Whether a rotation is due at `now`: a whole `period` passed since
    /// `current` began, or the clock went back by more than one (a start
    /// with the clock ahead, then NTP stepped it back): waiting for the
    /// clock to catch up would keep one key sealing for the whole skew.
    fn rotation_due(&self, now: u64, period: Duration) -> bool {
        now.saturating_sub(self.current_since) >= period.as_secs().max(1)
            || self.clock_went_back(now, period)
    }

    /// Whether `current` began more than a `period` after `now`.
    fn clock_went_back(&self, now: u64, period: Duration) -> bool {
        self.current_since > now.saturating_add(period.as_secs().max(1))
    }

    /// Rotated as many times as whole `period`s passed since `current`
    /// began (three or more: a whole new set, since no old ticket may
    /// open any more); a whole new set from `now` after the clock went
    /// back by more than a period.
    fn brought_up_to(mut self, now: u64, period: Duration) -> Result<TicketKeys, TicketError> {
        if self.clock_went_back(now, period) {
            return Ok(TicketKeys {
                current_since: now,
                ..TicketKeys::generate()?
            });
        }
        let period = period.as_secs().max(1);
        let due = now.saturating_sub(self.current_since) / period;
        let rng = SystemRandom::new();
        for _ in 0..due.min(3) {
            self.previous = std::mem::replace(&mut self.current, self.next.clone());
            self.next = TicketKey::generate(&rng)?;
        }
        self.current_since += due * period;
        Ok(self)
    }

    fn keys(&self) -> [&TicketKey; 3] {
        [&self.current, &self.previous, &self.next]
    }
}

/// The ciphers of a key set, made once per rotation.
struct Sealing {
    keys: TicketKeys,
    ciphers: [LessSafeKey; 3],
}

impl Sealing {
    fn new(keys: TicketKeys) -> Result<Sealing, TicketError> {
        let [c, p, n] = keys.keys();
        let ciphers = [c.sealing()?, p.sealing()?, n.sealing()?];
        Ok(Sealing { keys, ciphers })
    }
}

/// baton's key set and its ciphers; one per generation, shared by every
/// TLS listener (each through its [`ListenerTickets`]) and worker.
pub struct Ticketer {
    sealing: RwLock<Sealing>,
    period: Duration,
    rng: SystemRandom,
}

impl std::fmt::Debug for Ticketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticketer")
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl Ticketer {
    /// A ticketer over the `inherited` keys (brought up to date), or over
    /// new ones.
    pub fn new(inherited: Option<TicketKeys>, period: Duration) -> Result<Ticketer, TicketError> {
        let keys = match inherited {
            Some(keys) => keys.brought_up_to(unix_now(), period)?,
            None => TicketKeys::generate()?,
        };
        Ok(Ticketer {
            sealing: RwLock::new(Sealing::new(keys)?),
            period,
            rng: SystemRandom::new(),
        })
    }

    /// The key set as it is now, for the next generation.
    pub fn keys(&self) -> TicketKeys {
        self.rotate_if_due();
        self.read().keys.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Sealing> {
        self.sealing
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn rotate_if_due(&self) {
        let now = unix_now();
        if !self.read().keys.rotation_due(now, self.period) {
            return;
        }
        let mut sealing = self
            .sealing
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let rotated = sealing
            .keys
            .clone()
            .brought_up_to(now, self.period)
            .and_then(Sealing::new);
        match rotated {
            Ok(next) => *sealing = next,
            Err(err) => {
                tracing::warn!(cause = %err, "cannot rotate session-ticket keys; keeping the current ones")
            }
        }
    }

    /// `plain` sealed with the current key, bound to `scope`.
    fn seal(&self, scope: &Scope, plain: &[u8]) -> Option<Vec<u8>> {
        self.rotate_if_due();
        let sealing = self.read();
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(NAME_LEN + NONCE_LEN + plain.len() + 16);
        out.extend_from_slice(&sealing.keys.current.name);
        out.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        sealing.ciphers[0]
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(scope.associated(&sealing.keys.current.name)),
                &mut sealed,
            )
            .ok()?;
        out.extend_from_slice(&sealed);
        Some(out)
    }

    /// The state in `ticket`, if one of the keys sealed it for `scope`.
    fn open(&self, scope: &Scope, ticket: &[u8]) -> Option<Vec<u8>> {
        self.rotate_if_due();
        let name = ticket.get(..NAME_LEN)?;
        let nonce = ticket.get(NAME_LEN..NAME_LEN + NONCE_LEN)?;
        let sealing = self.read();
        let index = sealing.keys.keys().iter().position(|k| k.name == name)?;
        let mut opened = ticket.get(NAME_LEN + NONCE_LEN..)?.to_vec();
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let plain = sealing.ciphers[index]
            .open_in_place(nonce, Aad::from(scope.associated(name)), &mut opened)
            .ok()?;
        Some(plain.to_vec())
    }
}

/// What a ticket is bound to: a listener's name and its client-certificate
/// policy, as a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope([u8; SHA256_OUTPUT_LEN]);

impl Scope {
    /// The scope of listener `listener` whose client-certificate policy is
    /// `policy` (see `TlsSettings::client_policy`).
    pub fn new(listener: &str, policy: &[u8]) -> Scope {
        let mut digest = Digest::new(&SHA256);
        for part in [listener.as_bytes(), policy] {
            digest.update(&(part.len() as u64).to_be_bytes());
            digest.update(part);
        }
        let mut scope = [0; SHA256_OUTPUT_LEN];
        scope.copy_from_slice(digest.finish().as_ref());
        Scope(scope)
    }

    /// A ticket's associated data: its key's name, then this scope.
    fn associated(&self, key_name: &[u8]) -> [u8; NAME_LEN + SHA256_OUTPUT_LEN] {
        let mut data = [0; NAME_LEN + SHA256_OUTPUT_LEN];
        data[..NAME_LEN].copy_from_slice(key_name);
        data[NAME_LEN..].copy_from_slice(&self.0);
        data
    }
}

/// rustls' ticketer for one listener: the generation's keys, sealing in
/// the listener's scope.
#[derive(Debug)]
pub struct ListenerTickets {
    ticketer: Arc<Ticketer>,
    scope: Scope,
}

impl ListenerTickets {
    pub fn new(ticketer: Arc<Ticketer>, scope: Scope) -> ListenerTickets {
        ListenerTickets { ticketer, scope }
    }
}

impl rustls::server::ProducesTickets for ListenerTickets {
    fn enabled(&self) -> bool {
        true
    }

    /// The most a ticket lives: its key is current for one period, then
    /// previous for one more.
    fn lifetime(&self) -> u32 {
        u32::try_from(self.ticketer.period.as_secs().saturating_mul(2)).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.ticketer.seal(&self.scope, plain)
    }

    /// A ticket whose client certificate lapsed opens no more: a full
    /// handshake follows (see `tls::session`).
    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let session = self.ticketer.open(&self.scope, ticket)?;
        crate::tls::session::resumable(&session).then_some(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::ProducesTickets;

    const HOUR: Duration = Duration::from_secs(3600);

    fn web() -> Scope {
        Scope::new("web", b"none")
    }

    #[test]
    fn a_ticket_opens_only_on_its_listener_under_its_client_policy() {
        let ticketer = Arc::new(Ticketer::new(None, HOUR).expect("ticketer"));
        let tickets = |listener: &str, policy: &[u8]| {
            ListenerTickets::new(Arc::clone(&ticketer), Scope::new(listener, policy))
        };
        let ticket = tickets("web", b"none").encrypt(b"state").expect("sealed");
        assert_eq!(
            tickets("web", b"none").decrypt(&ticket).as_deref(),
            Some(&b"state"[..])
        );
        assert_eq!(tickets("mtls", b"none").decrypt(&ticket), None);
        assert_eq!(tickets("web", b"required ca").decrypt(&ticket), None);
        // Name and policy are told apart, not run together.
        assert_ne!(Scope::new("ab", b"c"), Scope::new("a", b"bc"));
    }

    #[test]
    fn a_ticket_opens_in_the_next_generation() {
        let first = Ticketer::new(None, HOUR).expect("ticketer");
        let ticket = first.seal(&web(), b"session state").expect("sealed");
        let next = Ticketer::new(Some(first.keys()), HOUR).expect("inherited");
        assert_eq!(
            next.open(&web(), &ticket).as_deref(),
            Some(&b"session state"[..])
        );
    }

    #[test]
    fn a_ticket_from_elsewhere_or_tampered_with_does_not_open() {
        let ours = Ticketer::new(None, HOUR).expect("ticketer");
        let theirs = Ticketer::new(None, HOUR).expect("ticketer");
        let mut ticket = ours.seal(&web(), b"state").expect("sealed");
        assert_eq!(theirs.open(&web(), &ticket), None);
        let last = ticket.len() - 1;
        ticket[last] ^= 1;
        assert_eq!(ours.open(&web(), &ticket), None);
        assert_eq!(ours.open(&web(), &ticket[..10]), None);
    }

    #[test]
    fn a_ticket_lives_one_rotation_and_not_two() {
        let keys = TicketKeys::generate().expect("keys");
        let start = keys.current_since;
        let ticketer = Ticketer::new(Some(keys.clone()), HOUR).expect("ticketer");
        let ticket = ticketer.seal(&web(), b"state").expect("sealed");
        let once = keys
            .clone()
            .brought_up_to(start + 3600, HOUR)
            .expect("rotated");
        let after_one = Ticketer::new(Some(once.clone()), HOUR).expect("ticketer");
        assert!(
            after_one.open(&web(), &ticket).is_some(),
            "previous key still opens"
        );
        assert_eq!(once.current_since, start + 3600);
        let twice = keys.brought_up_to(start + 7200, HOUR).expect("rotated");
        let after_two = Ticketer::new(Some(twice), HOUR).expect("ticketer");
        assert_eq!(
            after_two.open(&web(), &ticket),
            None,
            "two rotations later it is gone"
        );
    }

    /// Keys whose time lies ahead of the clock by more than a period (the
    /// clock was stepped back) are replaced whole now, not kept sealing
    /// until the clock catches up.
    #[test]
    fn keys_from_a_clock_that_went_back_are_replaced_at_once() {
        let mut keys = TicketKeys::generate().expect("keys");
        let now = keys.current_since;
        let within = TicketKeys {
            current_since: now + 1800,
            ..keys.clone()
        };
        assert!(!within.rotation_due(now, HOUR), "within a period: kept");
        keys.current_since = now + 10 * 3600;
        assert!(keys.rotation_due(now, HOUR));
        let sealed = Ticketer::new(Some(keys.clone()), HOUR)
            .expect("ticketer")
            .seal(&web(), b"state")
            .expect("sealed");
        let fresh = keys.brought_up_to(now, HOUR).expect("replaced");
        assert_eq!(fresh.current_since, now);
        assert!(!fresh.rotation_due(now, HOUR));
        let after = Ticketer::new(Some(fresh), HOUR).expect("ticketer");
        assert_eq!(after.open(&web(), &sealed), None, "a whole new set");
    }

    #[test]
    fn a_generation_that_rotated_opens_tickets_of_one_that_did_not() {
        let keys = TicketKeys::generate().expect("keys");
        let start = keys.current_since;
        let behind = Ticketer::new(Some(keys.clone()), HOUR).expect("ticketer");
        let ahead = Ticketer::new(
            Some(keys.brought_up_to(start + 3600, HOUR).expect("rotated")),
            HOUR,
        )
        .expect("ticketer");
        let ticket = ahead
            .seal(&web(), b"state")
            .expect("sealed by the rotated set");
        assert!(
            behind.open(&web(), &ticket).is_some(),
            "its next key opens it"
        );
    }

    #[test]
    fn debug_shows_no_secret() {
        let keys = TicketKeys::generate().expect("keys");
        let shown = format!("{keys:?}");
        assert!(
            !shown.contains(&format!("{:?}", keys.current.secret)),
            "{shown}"
        );
        assert!(shown.contains("TicketKey(..)"), "{shown}");
    }
}
