//! Loading and checking one `certificates` entry (and the `client_ca`
//! bundle): both files are read and parsed, the key must match the leaf and
//! the chain must run leaf first, or the entry is refused (a reload with
//! one fails and the running generation keeps serving). A certificate not
//! valid now (expired, or not yet) loads with a warning: clients refuse
//! it, but refusing the config would take every other entry and listener
//! down with it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::sign::{CertifiedKey, SigningKey};
use rustls::{InconsistentKeys, RootCertStore};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::{format_time, provider, unix_seconds, CertificateInfo};
use crate::named_file::NamedFileError;

/// A certificate expiring sooner than this loads with a warning: two weeks
/// leaves room for a renewal that failed silently to be noticed and fixed.
pub const EXPIRY_WARNING_SECS: i64 = 14 * DAY;

const DAY: i64 = 24 * 60 * 60;

/// Which file a problem is about, so the config can name its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Cert,
    Key,
    ClientCa,
    ClientCrl,
}

impl Part {
    /// The key's last segment.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Cert => "cert",
            Part::Key => "key",
            Part::ClientCa => "client_ca",
            Part::ClientCrl => "client_crl",
        }
    }
}

/// Something wrong (or, as a warning, soon wrong) with one file.
#[derive(Debug, thiserror::Error)]
#[error("{reason} (file {})", path.display())]
pub struct Problem {
    pub part: Part,
    pub path: PathBuf,
    pub reason: Reason,
}

#[derive(Debug, thiserror::Error)]
pub enum Reason {
    #[error("cannot read: {}{}", .0, crate::named_file::refused_as(.0))]
    Read(std::io::Error),
    #[error("is not a regular file")]
    NotAFile,
    #[error("is larger than {} MiB: not a certificate or key file", MAX_FILE >> 20)]
    TooLarge,
    #[error("is not valid PEM: {0}")]
    Pem(pem::Error),
    #[error("holds no PEM certificate")]
    NoCertificate,
    #[error("holds no PEM certificate revocation list (X509 CRL)")]
    NoCrl,
    #[error("holds no PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)")]
    NoKey,
    #[error("holds an encrypted private key, which baton cannot read without its passphrase: write it out unencrypted, readable by the service's user alone (openssl pkey -in KEY -out PLAIN)")]
    EncryptedKey,
    #[error("{}is not an X.509 certificate: {message}", chain(*.index))]
    NotX509 { index: usize, message: String },
    #[error("{}cannot be used: {error}", chain(*.index))]
    Unusable { index: usize, error: rustls::Error },
    #[error("certificate {} of the bundle cannot be used as a root: {error}", .index + 1)]
    UnusableRoot { index: usize, error: rustls::Error },
    #[error("holds no certificate usable as a root ({passed_over} passed over)")]
    NoRoot { passed_over: usize },
    #[error("is not a private key rustls can sign with: {0}")]
    UnsupportedKey(rustls::Error),
    #[error("does not match the certificate in {}", cert.display())]
    KeyMismatch { cert: std::path::PathBuf },
    #[error("is out of order: chain[{}] did not issue chain[{index}] (the leaf comes first, each certificate followed by its issuer)", index + 1)]
    ChainOrder { index: usize },
    #[error("{}expired on {}", chain(*.index), format_time(*.at))]
    Expired { index: usize, at: i64 },
    #[error("{}is not valid before {}", chain(*.index), format_time(*.at))]
    NotYetValid { index: usize, at: i64 },
    #[error("{}expires on {}, in {days} day(s)", chain(*.index), format_time(*.at))]
    ExpiresSoon { index: usize, at: i64, days: i64 },
}

/// How a problem names a certificate of the chain: the leaf needs no name.
fn chain(index: usize) -> String {
    match index {
        0 => String::new(),
        i => format!("chain[{i}] "),
    }
}

/// One entry, loaded and checked.
#[derive(Debug)]
pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    pub info: CertificateInfo,
    /// Not fatal: a certificate of the chain expired, is not valid yet, or
    /// expires within two weeks.
    pub warnings: Vec<Problem>,
}

/// Loads the chain at `cert` and the key at `key`, checked as of `now`:
/// every problem found, or the entry with its warnings.
pub fn load(cert: &Path, key: &Path, now: SystemTime) -> Result<Loaded, Vec<Problem>> {
    let (chain, signing) = match (read_chain(cert, Part::Cert), read_key(key)) {
        (Ok(chain), Ok(signing)) => (chain, signing),
        (chain, signing) => return Err(chain.err().into_iter().chain(signing.err()).collect()),
    };
    let certified = CertifiedKey::new(chain, signing);
    let parsed = parse_chain(&certified.cert).map_err(|r| vec![problem(Part::Cert, cert, r)])?;
    let mut errors: Vec<Problem> = mismatch(&certified, cert, key).into_iter().collect();
    let warned = validity(&parsed, unix_seconds(now));
    errors.extend(chain_order(&parsed).map(|r| problem(Part::Cert, cert, r)));
    if !errors.is_empty() {
        return Err(errors);
    }
    // read_chain returns at least one certificate, so there is a leaf.
    let info = info(&parsed[0]);
    Ok(Loaded {
        key: Arc::new(certified),
        info,
        warnings: warned
            .into_iter()
            .map(|r| problem(Part::Cert, cert, r))
            .collect(),
    })
}

/// The trust anchors of a CA bundle the config names: each certificate
/// webpki cannot take as a root is a problem, all said at once.
pub fn load_roots(path: &Path) -> Result<RootCertStore, Vec<Problem>> {
    let (roots, passed_over) = load_roots_passing_over(path).map_err(|p| vec![p])?;
    match passed_over.is_empty() {
        true => Ok(roots),
        false => Err(passed_over),
    }
}

/// The certificate revocation lists at `path` (PEM `X509 CRL` blocks, as
/// nginx's `ssl_crl` and HAProxy's `crl-file` read them).
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, Problem> {
    let bytes = read_file(path).map_err(|reason| problem(Part::ClientCrl, path, reason))?;
    let crls: Result<Vec<_>, _> = CertificateRevocationListDer::pem_slice_iter(&bytes).collect();
    match crls {
        Ok(crls) if !crls.is_empty() => Ok(crls),
        Ok(_) => Err(problem(Part::ClientCrl, path, Reason::NoCrl)),
        Err(err) => Err(problem(
            Part::ClientCrl,
            path,
            pem_reason(err, Reason::NoCrl),
        )),
    }
}

/// A revocation list's issuer (its DER name) and next update (seconds
/// since the epoch), if it parses as one.
pub fn crl_facts(der: &[u8]) -> Option<(Vec<u8>, Option<i64>)> {
    let (_, crl) = x509_parser::parse_x509_crl(der).ok()?;
    let next = crl.next_update().map(|t| t.timestamp());
    Some((crl.issuer().as_raw().to_vec(), next))
}

/// The trust anchors of the system's bundle, which others write to (a
/// local CA added with update-ca-certificates): a certificate webpki
/// cannot take as a root is passed over, each returned as a warning, as
/// OpenSSL-based proxies load such a bundle; one with no usable root at
/// all is a problem.
pub fn load_system_roots(path: &Path) -> Result<(RootCertStore, Vec<Problem>), Problem> {
    let (roots, passed_over) = load_roots_passing_over(path)?;
    if roots.is_empty() {
        let passed_over = passed_over.len();
        return Err(problem(
            Part::ClientCa,
            path,
            Reason::NoRoot { passed_over },
        ));
    }
    Ok((roots, passed_over))
}

fn load_roots_passing_over(path: &Path) -> Result<(RootCertStore, Vec<Problem>), Problem> {
    let mut roots = RootCertStore::empty();
    let mut passed_over = Vec::new();
    for (index, der) in read_chain(path, Part::ClientCa)?.into_iter().enumerate() {
        if let Err(error) = roots.add(der) {
            passed_over.push(problem(
                Part::ClientCa,
                path,
                Reason::UnusableRoot { index, error },
            ));
        }
    }
    Ok((roots, passed_over))
}

fn problem(part: Part, path: &Path, reason: Reason) -> Problem {
    Problem {
        part,
        path: path.to_path_buf(),
        reason,
    }
}

/// The largest certificate, key or CA bundle file read (a system bundle
/// is a few hundred KiB).
const MAX_FILE: u64 = 8 << 20;

/// A regular file's bytes, at most `MAX_FILE` (`named_file`: a device or
/// a FIFO is refused, not read for ever).
fn read_file(path: &Path) -> Result<Vec<u8>, Reason> {
    crate::named_file::read(path, MAX_FILE).map_err(|err| match err {
        NamedFileError::Read(err) => Reason::Read(err),
        NamedFileError::NotAFile => Reason::NotAFile,
        NamedFileError::TooLarge(_) => Reason::TooLarge,
    })
}

/// Every PEM certificate in the file, in order; at least one.
fn read_chain(path: &Path, part: Part) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let bytes = read_file(path).map_err(|reason| problem(part, path, reason))?;
    let chain: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
    match chain {
        Ok(chain) if !chain.is_empty() => Ok(chain),
        Ok(_) => Err(problem(part, path, Reason::NoCertificate)),
        Err(err) => Err(problem(part, path, pem_reason(err, Reason::NoCertificate))),
    }
}

/// The first private key in the file (PKCS#8, PKCS#1 RSA or SEC1 EC).
/// An encrypted one is said to be one (rustls skips an `ENCRYPTED PRIVATE
/// KEY` block, and a legacy `Proc-Type: 4,ENCRYPTED` one reads as bad
/// base64: either would be reported as something else).
fn read_key(path: &Path) -> Result<Arc<dyn SigningKey>, Problem> {
    let der = read_file(path).and_then(|bytes| {
        PrivateKeyDer::from_pem_slice(&bytes).map_err(|err| match encrypted(&bytes) {
            true => Reason::EncryptedKey,
            false => pem_reason(err, Reason::NoKey),
        })
    });
    der.and_then(|der| {
        provider()
            .key_provider
            .load_private_key(der)
            .map_err(Reason::UnsupportedKey)
    })
    .map_err(|reason| problem(Part::Key, path, reason))
}

/// Whether a key file's PEM says it is encrypted (PKCS#8's label, or the
/// legacy OpenSSL header).
fn encrypted(pem: &[u8]) -> bool {
    [
        &b"-----BEGIN ENCRYPTED PRIVATE KEY-----"[..],
        b"Proc-Type: 4,ENCRYPTED",
    ]
    .iter()
    .any(|mark| pem.windows(mark.len()).any(|w| w == *mark))
}

fn pem_reason(err: pem::Error, none_found: Reason) -> Reason {
    match err {
        pem::Error::Io(err) => Reason::Read(err),
        pem::Error::NoItemsFound => none_found,
        other => Reason::Pem(other),
    }
}

fn parse_chain<'a>(chain: &'a [CertificateDer<'_>]) -> Result<Vec<X509Certificate<'a>>, Reason> {
    chain
        .iter()
        .enumerate()
        .map(
            |(index, der)| match x509_parser::parse_x509_certificate(der) {
                Ok((_, cert)) => Ok(cert),
                Err(err) => Err(Reason::NotX509 {
                    index,
                    message: err.to_string(),
                }),
            },
        )
        .collect()
}

/// Why the key cannot serve the leaf, if it cannot. ring's keys always
/// know their public half, so "unknown" (which rustls allows) never hides
/// a mismatch here.
fn mismatch(certified: &CertifiedKey, cert: &Path, key: &Path) -> Option<Problem> {
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => None,
        Err(rustls::Error::InconsistentKeys(_)) => {
            let cert = cert.to_path_buf();
            Some(problem(Part::Key, key, Reason::KeyMismatch { cert }))
        }
        Err(error) => Some(problem(
            Part::Cert,
            cert,
            Reason::Unusable { index: 0, error },
        )),
    }
}

/// The first place the chain breaks: each certificate must be issued by
/// the next one (a leaf alone is a chain too).
fn chain_order(parsed: &[X509Certificate<'_>]) -> Option<Reason> {
    parsed
        .windows(2)
        .position(|pair| pair[0].issuer().as_raw() != pair[1].subject().as_raw())
        .map(|index| Reason::ChainOrder { index })
}

/// The chain's validity now, as warnings: a certificate expired, not
/// valid yet, or expiring within [`EXPIRY_WARNING_SECS`]. None refuses the
/// entry: clients refuse an expired leaf or issuer themselves, but a
/// refused entry failed the whole config, so one lapsed name of twenty
/// failed every reload (a drained backend, another name's renewal) and,
/// at the next reboot or crash, kept every listener down, plain ones too;
/// nginx and HAProxy serve it. Further up, a chain may carry an expired
/// certificate for old clients (Let's Encrypt's chains carried ISRG Root
/// X1 cross-signed by the expired DST Root CA X3 for years), which
/// clients that trust the one below it never use.
fn validity(parsed: &[X509Certificate<'_>], now: i64) -> Vec<Reason> {
    let mut warned = Vec::new();
    for (index, cert) in parsed.iter().enumerate() {
        let at = cert.validity().not_after.timestamp();
        if let Some(lapsed) = outside_validity(cert, index, now) {
            warned.push(lapsed);
        } else if at - now < EXPIRY_WARNING_SECS {
            // Rounded up: "in 0 day(s)" would read as "already".
            let days = (at - now + DAY - 1) / DAY;
            warned.push(Reason::ExpiresSoon { index, at, days });
        }
    }
    warned
}

/// Chain entry `index` is expired or not yet valid at `now` (seconds
/// since the epoch), compared as webpki compares: to the second.
fn outside_validity(cert: &X509Certificate<'_>, index: usize, now: i64) -> Option<Reason> {
    let validity = cert.validity();
    let (from, until) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    if now > until {
        Some(Reason::Expired { index, at: until })
    } else if now < from {
        Some(Reason::NotYetValid { index, at: from })
    } else {
        None
    }
}

/// Why a client's leaf certificate `der` is outside its validity at `now`,
/// if it is. The leaf alone, as Go's server checks a resumed session's: a
/// chain may carry certificates no path used (an expired cross-sign, the
/// root itself), whose dates a full handshake never looks at either. One
/// that does not parse is passed over (rustls verified it).
pub fn leaf_lapsed(der: &[u8], now: i64) -> Option<Reason> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    outside_validity(&cert, 0, now)
}

fn info(leaf: &X509Certificate<'_>) -> CertificateInfo {
    let names = served_names(leaf);
    CertificateInfo {
        name: names
            .first()
            .cloned()
            .unwrap_or_else(|| leaf.subject().to_string()),
        names,
        not_before_unix: leaf.validity().not_before.timestamp(),
        not_after_unix: leaf.validity().not_after.timestamp(),
    }
}

/// The names a certificate serves: its DNS subjectAltNames (`*.` wildcards
/// included), or, with none, its subject CN, as clients that predate SANs
/// read it. Lower-cased, since names match case-insensitively.
fn served_names(cert: &X509Certificate<'_>) -> Vec<String> {
    let sans: Vec<String> = match cert.subject_alternative_name() {
        Ok(Some(ext)) => ext
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if !sans.is_empty() {
        return sans;
    }
    cert.subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .map(str::to_ascii_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::{load, load_roots, load_system_roots, Part, Problem};
    use crate::tls::testing::Pki;

    /// Loads `cert` and `key` text written to files of those names.
    fn load_texts(pki: &Pki, cert: &str, key: &str) -> Result<super::Loaded, Vec<Problem>> {
        let cert = pki.write("a.pem", cert);
        let key = pki.write("a.key", key);
        load(&cert, &key, SystemTime::now())
    }

    fn only_problem(result: Result<super::Loaded, Vec<Problem>>) -> Problem {
        let mut problems = result.expect_err("refused");
        assert_eq!(problems.len(), 1, "{problems:?}");
        problems.remove(0)
    }

    /// The one warning an entry that loads comes with.
    fn only_warning(result: Result<super::Loaded, Vec<Problem>>) -> String {
        let loaded = result.expect("loads");
        assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
        loaded.warnings[0].to_string()
    }

    #[test]
    fn a_good_chain_and_key_load_with_their_names() {
        let pki = Pki::new();
        let leaf = pki.leaf(
            "a.example.com",
            &["a.example.com", "*.A.example.com"],
            -1..90,
        );
        let loaded = load_texts(&pki, &leaf.chain(), &leaf.key).expect("loads");
        assert_eq!(loaded.info.name, "a.example.com");
        assert_eq!(loaded.info.names, ["a.example.com", "*.a.example.com"]);
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        assert_eq!(loaded.key.cert.len(), 2);
    }

    #[test]
    fn without_sans_the_subject_cn_is_served() {
        let pki = Pki::new();
        let leaf = pki.leaf("Legacy.Example.com", &[], -1..90);
        let loaded = load_texts(&pki, &leaf.cert, &leaf.key).expect("loads");
        assert_eq!(loaded.info.names, ["legacy.example.com"]);
    }

    #[test]
    fn a_key_from_another_certificate_is_refused_naming_the_key() {
        let pki = Pki::new();
        let a = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let b = pki.leaf("b.example.com", &["b.example.com"], -1..90);
        let p = only_problem(load_texts(&pki, &a.cert, &b.key));
        assert_eq!(p.part, Part::Key);
        let cert = p.path.with_file_name("a.pem");
        let expected = format!(
            "does not match the certificate in {} (file {})",
            cert.display(),
            p.path.display()
        );
        assert_eq!(p.to_string(), expected);
        assert!(p.path.ends_with("a.key"));
    }

    /// An expired leaf loads, with a warning naming its date: clients
    /// refuse it, but one lapsed entry must not fail the whole config.
    #[test]
    fn an_expired_certificate_loads_with_a_warning_naming_its_date() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -30..-2);
        let warning = only_warning(load_texts(&pki, &leaf.cert, &leaf.key));
        let expires = x509_parser::parse_x509_certificate(&pem_der(&leaf.cert))
            .expect("x509")
            .1
            .validity()
            .not_after
            .timestamp();
        let date = crate::tls::format_time(expires);
        assert!(
            warning.starts_with(&format!("expired on {date} (file ")),
            "{warning}"
        );
    }

    /// An expired cross-sign after the issuer, as Let's Encrypt's chains
    /// carried one, loads with a warning naming it.
    #[test]
    fn an_expired_certificate_further_up_the_chain_loads_with_a_warning() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let chain = format!("{}{}", leaf.chain(), pki.expired_cross_sign());
        let warning = only_warning(load_texts(&pki, &chain, &leaf.key));
        assert!(warning.starts_with("chain[2] expired on "), "{warning}");
    }

    /// The leaf's own issuer expired: a warning naming chain[1].
    #[test]
    fn an_expired_issuer_loads_with_a_warning() {
        let pki = Pki::with_ca_valid(-30..-2);
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let warning = only_warning(load_texts(&pki, &leaf.chain(), &leaf.key));
        assert!(warning.starts_with("chain[1] expired on "), "{warning}");
    }

    #[test]
    fn a_certificate_not_yet_valid_loads_with_a_warning() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], 2..90);
        let warning = only_warning(load_texts(&pki, &leaf.cert, &leaf.key));
        assert!(warning.starts_with("is not valid before "), "{warning}");
    }

    #[test]
    fn a_certificate_expiring_within_two_weeks_loads_with_a_warning() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..5);
        let warning = only_warning(load_texts(&pki, &leaf.cert, &leaf.key));
        assert!(warning.contains(", in 5 day(s) (file "), "{warning}");
    }

    #[test]
    fn a_chain_in_the_wrong_order_is_refused() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let reversed = format!("{}{}", leaf.ca, leaf.cert);
        let problems = load_texts(&pki, &reversed, &leaf.key).expect_err("refused");
        // The CA leads, so the key does not match it either.
        assert!(
            problems.iter().any(|p| p.part == Part::Cert
                && p.to_string()
                    .starts_with("is out of order: chain[1] did not issue chain[0]")),
            "{problems:?}"
        );
    }

    #[test]
    fn missing_files_are_each_named() {
        let pki = Pki::new();
        let cert = pki.dir.path().join("none.pem");
        let key = pki.dir.path().join("none.key");
        let problems = load(&cert, &key, SystemTime::now()).expect_err("refused");
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[0].part, Part::Cert);
        assert_eq!(problems[1].part, Part::Key);
        let text = problems[0].to_string();
        assert!(text.starts_with("cannot read: "), "{text}");
        assert!(
            text.ends_with(&format!("(file {})", cert.display())),
            "{text}"
        );
    }

    #[test]
    fn a_device_or_a_huge_file_is_refused_not_read_forever() {
        let pki = Pki::new();
        let huge = pki.dir.path().join("huge.pem");
        std::fs::write(&huge, vec![b'A'; (super::MAX_FILE + 1) as usize]).expect("write");
        let zero = std::path::Path::new("/dev/zero");
        let problems = load(&huge, zero, SystemTime::now()).expect_err("refused");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].to_string().starts_with("is larger than 8 MiB"),
            "{problems:?}"
        );
        assert_eq!(problems[1].part, Part::Key);
        assert!(
            problems[1].to_string().starts_with("is not a regular file"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_fifo_nobody_writes_to_is_refused_at_once() {
        let pki = Pki::new();
        let fifo = pki.dir.path().join("a.key");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR).expect("mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(super::read_file(&fifo).map(|_| ()));
        });
        let read = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert!(matches!(read, Ok(Err(super::Reason::NotAFile))), "{read:?}");
    }

    /// A resumed session's leaf is looked at again: outside its validity
    /// now, it is told when; its CA's dates are not its own.
    #[test]
    fn a_leaf_outside_its_validity_now_is_told() {
        let now = crate::tls::unix_seconds(SystemTime::now());
        let told = |pki: &Pki, days| {
            let der = pem_der(&pki.leaf("c", &[], days).cert);
            super::leaf_lapsed(&der, now).map_or_else(String::new, |r| r.to_string())
        };
        let pki = Pki::new();
        assert_eq!(told(&pki, -1..1), "");
        assert!(told(&pki, -3..-1).starts_with("expired on 20"));
        assert!(told(&pki, 1..3).starts_with("is not valid before 20"));
        assert_eq!(told(&Pki::with_ca_valid(-3..-1), -1..1), "");
    }

    #[test]
    fn a_key_file_without_a_key_says_so() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let p = only_problem(load_texts(&pki, &leaf.cert, &leaf.cert));
        assert_eq!(p.part, Part::Key);
        assert!(p.to_string().starts_with("holds no PEM private key"), "{p}");
    }

    /// An encrypted key is said to be one, in PKCS#8's form and in
    /// OpenSSL's legacy one (each read as something else before).
    #[test]
    fn an_encrypted_key_says_so() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        for key in [
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkqhkiG9w0BBQ0wSjAp\n-----END ENCRYPTED PRIVATE KEY-----\n",
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\nMIIB\n-----END RSA PRIVATE KEY-----\n",
        ] {
            let p = only_problem(load_texts(&pki, &leaf.cert, key));
            assert_eq!(p.part, Part::Key);
            assert!(p.to_string().starts_with("holds an encrypted private key"), "{p}");
        }
    }

    #[test]
    fn a_client_ca_bundle_loads_as_roots() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let roots = load_roots(&pki.write("ca.pem", &leaf.ca)).expect("roots");
        assert_eq!(roots.len(), 1);
        let empty = load_roots(&pki.write("empty.pem", "")).expect_err("refused");
        assert_eq!(empty[0].part, Part::ClientCa);
    }

    /// A certificate webpki cannot take as a root: a problem in a bundle
    /// the config names, passed over with a warning in the system's.
    #[test]
    fn an_unusable_root_is_refused_in_a_named_bundle_and_passed_over_in_the_systems() {
        let pki = Pki::new();
        let leaf = pki.leaf("a.example.com", &["a.example.com"], -1..90);
        let unusable = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let bundle = pki.write("bundle.pem", &format!("{}{unusable}", leaf.ca));
        let refused = load_roots(&bundle).expect_err("refused");
        assert!(
            refused.len() == 1
                && refused[0]
                    .to_string()
                    .starts_with("certificate 2 of the bundle cannot be used as a root"),
            "{refused:?}"
        );
        // Every one of them, not the first alone.
        let twice = pki.write("twice.pem", &format!("{unusable}{}{unusable}", leaf.ca));
        let refused = load_roots(&twice).expect_err("refused");
        let said: Vec<String> = refused.iter().map(ToString::to_string).collect();
        assert!(
            said.len() == 2
                && said[0].starts_with("certificate 1 ")
                && said[1].starts_with("certificate 3 "),
            "{said:?}"
        );
        let (roots, warned) = load_system_roots(&bundle).expect("loads");
        assert_eq!((roots.len(), warned.len()), (1, 1));
        assert!(
            warned[0]
                .to_string()
                .starts_with("certificate 2 of the bundle cannot be used as a root"),
            "{}",
            warned[0]
        );
        let only = pki.write("only.pem", unusable);
        let none = load_system_roots(&only).expect_err("no usable root at all");
        assert!(
            none.to_string()
                .starts_with("holds no certificate usable as a root (1 passed over)"),
            "{none}"
        );
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("pem")
            .to_vec()
    }
}
