//! A listener's `tls` key: the certificate files, loaded and checked by
//! [`crate::tls::certs`], ALPN, the oldest version, client certificates;
//! built into the [`TlsSettings`] the listener carries. A certificate that
//! expires within two weeks is a warning, not a problem: refusing it would
//! turn a renewal still to come into an outage today.

use std::sync::Arc;
use std::time::SystemTime;

use super::*;
use crate::tls::upstream::UpstreamTls;
use crate::tls::{certs, ClientAuth, ClientCa, MinVersion, Spec, TlsSettings};
use rustls::pki_types::ServerName;

/// Where distributions keep the system's CA bundle, the roots a verified
/// backend is checked against without `ca`: Debian and Ubuntu; Fedora,
/// RHEL and their kin; SUSE; Alpine and the BSDs' layout. The first that
/// exists is read, unless `SSL_CERT_FILE` names one (OpenSSL's own
/// variable, which Go and curl read too).
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The system's bundle: `SSL_CERT_FILE` if set, else the first of
/// [`SYSTEM_BUNDLES`] that `exists` (else the first, whose absence the
/// problem then names).
fn system_bundle(
    from_env: Option<std::ffi::OsString>,
    exists: impl Fn(&std::path::Path) -> bool,
) -> std::path::PathBuf {
    if let Some(named) = from_env.filter(|v| !v.is_empty()) {
        return named.into();
    }
    SYSTEM_BUNDLES
        .iter()
        .map(std::path::Path::new)
        .find(|p| exists(p))
        .unwrap_or(std::path::Path::new(SYSTEM_BUNDLES[0]))
        .to_path_buf()
}

/// The ALPN protocols an HTTP listener speaks (and its default list).
const HTTP_ALPN: &[&str] = &["h2", "http/1.1"];

impl Validator {
    /// `key` is the listener's `tls` key path (`listeners[0].tls`).
    pub(super) fn tls(
        &mut self,
        key: &str,
        raw: Option<&file::TlsFile>,
        protocol: Protocol,
    ) -> Option<Arc<TlsSettings>> {
        let raw = raw?;
        let before = self.problems.len();
        let spec = Spec {
            certificates: self.certificates(key, &raw.certificates),
            alpn: self.alpn(&format!("{key}.alpn"), raw.alpn.as_deref(), protocol),
            min_version: self
                .min_version(&format!("{key}.min_version"), raw.min_version.as_deref()),
            handshake_timeout: self.timeout(
                &format!("{key}.handshake_timeout"),
                raw.handshake_timeout.as_ref(),
                Duration::from_secs(10),
            ),
            client_ca: self.client_ca(key, raw),
        };
        if self.problems.len() > before {
            return None;
        }
        match TlsSettings::build(spec) {
            Ok(settings) => Some(Arc::new(settings)),
            Err(err) => {
                self.problem(key, err);
                None
            }
        }
    }

    /// A pool's `tls` (`key` is `pools[0].tls`): the roots are `ca`, else
    /// the system bundle, read now; none are needed with `verify = false`.
    pub(super) fn upstream_tls(
        &mut self,
        key: &str,
        raw: Option<&file::UpstreamTlsFile>,
    ) -> Option<Arc<UpstreamTls>> {
        let raw = raw?;
        let verify = raw.verify.unwrap_or(true);
        // Every problem at once: a bad server_name does not hide the ca's.
        let server_name = raw
            .server_name
            .as_deref()
            .map(ServerName::try_from)
            .transpose();
        if server_name.is_err() {
            self.problem(
                &format!("{key}.server_name"),
                "is not a DNS name or an IP address",
            );
        }
        let roots = match (verify, raw.ca.as_deref()) {
            (false, None) => None,
            (_, None) => Some(self.system_roots(&format!("{key}.ca"))?),
            (_, Some(written)) => {
                match certs::load_roots(&self.read_path(&format!("{key}.ca"), written)) {
                    Ok(roots) => Some(Arc::new(roots)),
                    Err(problems) => {
                        for p in problems {
                            self.problem(&format!("{key}.ca"), p);
                        }
                        return None;
                    }
                }
            }
        };
        let server_name = server_name.ok()?.map(|name| name.to_owned());
        match UpstreamTls::new(server_name, roots, verify) {
            Ok(tls) => Some(Arc::new(tls)),
            Err(err) => {
                self.problem(key, err);
                None
            }
        }
    }

    /// The system's CA bundle, the default `ca` of a pool's `tls`: read
    /// once, its problem or warnings named after `key`, the first pool's,
    /// and shared by every pool that uses it.
    fn system_roots(&mut self, key: &str) -> Option<Arc<rustls::RootCertStore>> {
        if self.system_roots.is_none() {
            let bundle = system_bundle(std::env::var_os("SSL_CERT_FILE"), std::path::Path::exists);
            let loaded = match certs::load_system_roots(&bundle) {
                Ok((roots, passed_over)) => {
                    for p in passed_over {
                        self.warning(key, format!("passed over in the system's bundle: {p}"));
                    }
                    Some(Arc::new(roots))
                }
                Err(p) => {
                    self.problem(key, p);
                    None
                }
            };
            self.system_roots = Some(loaded);
        }
        self.system_roots.clone().flatten()
    }

    /// Each entry loaded and checked as of now; problems and warnings are
    /// named by the entry's `cert` or `key`.
    fn certificates(&mut self, key: &str, raw: &[file::CertificateFile]) -> Vec<certs::Loaded> {
        let key = format!("{key}.certificates");
        if raw.is_empty() {
            self.problem(&key, "needs at least one { cert = \"...\", key = \"...\" }");
        }
        let now = SystemTime::now();
        let mut out = Vec::new();
        for (i, entry) in raw.iter().enumerate() {
            let entry_key = format!("{key}[{i}]");
            let cert = self.read_required(&format!("{entry_key}.cert"), entry.cert.as_deref());
            let private = self.read_required(&format!("{entry_key}.key"), entry.key.as_deref());
            let (Some(cert), Some(private)) = (cert, private) else {
                continue;
            };
            match certs::load(&cert, &private, now) {
                Ok(loaded) => {
                    for w in &loaded.warnings {
                        self.warning(&format!("{entry_key}.{}", w.part.as_str()), w);
                    }
                    out.push(loaded);
                }
                Err(problems) => {
                    for p in problems {
                        self.problem(&format!("{entry_key}.{}", p.part.as_str()), p);
                    }
                }
            }
        }
        out
    }

    fn read_required(&mut self, key: &str, written: Option<&str>) -> Option<PathBuf> {
        match written {
            Some(path) => Some(self.read_path(key, path)),
            None => {
                self.problem(key, "is required");
                None
            }
        }
    }

    /// `written` as a path (relative to the config's folder), noted as a
    /// file the daemon reads.
    fn read_path(&mut self, key: &str, written: &str) -> PathBuf {
        let path = self.path(Some(written), written);
        self.reads(key, &path);
        path
    }

    /// HTTP listeners speak only h2 and http/1.1, so only those may be
    /// offered; a TCP listener passes bytes through and may offer any.
    fn alpn(&mut self, key: &str, raw: Option<&[String]>, protocol: Protocol) -> Vec<String> {
        let Some(raw) = raw else {
            return match protocol {
                Protocol::Http => HTTP_ALPN.iter().map(ToString::to_string).collect(),
                Protocol::Tcp => Vec::new(),
            };
        };
        for (i, name) in raw.iter().enumerate() {
            let refused = match protocol {
                Protocol::Http if !HTTP_ALPN.contains(&name.as_str()) => {
                    format!("\"{name}\" is not one of h2, http/1.1 (what an http listener speaks)")
                }
                // RFC 7301: a protocol name is 1 to 255 bytes.
                Protocol::Tcp if name.is_empty() || name.len() > 255 => {
                    format!("\"{name}\" must be 1 to 255 bytes long")
                }
                _ => continue,
            };
            self.problem(&format!("{key}[{i}]"), refused);
        }
        raw.to_vec()
    }

    fn min_version(&mut self, key: &str, raw: Option<&str>) -> MinVersion {
        match raw {
            None | Some("1.2") => MinVersion::Tls12,
            Some("1.3") => MinVersion::Tls13,
            Some(other) => {
                self.problem(key, format!("\"{other}\" is not one of 1.2, 1.3"));
                MinVersion::Tls12
            }
        }
    }

    fn client_ca(&mut self, key: &str, raw: &file::TlsFile) -> Option<ClientCa> {
        let auth_key = format!("{key}.client_auth");
        let auth = match raw.client_auth.as_deref() {
            None | Some("required") => ClientAuth::Required,
            Some("optional") => ClientAuth::Optional,
            Some(other) => {
                self.problem(
                    &auth_key,
                    format!("\"{other}\" is not one of required, optional"),
                );
                ClientAuth::Required
            }
        };
        let Some(written) = raw.client_ca.as_deref() else {
            for (set, named) in [
                (raw.client_auth.is_some(), &auth_key),
                (raw.client_crl.is_some(), &format!("{key}.client_crl")),
            ] {
                if set {
                    self.problem(
                        named,
                        "needs client_ca (the CA bundle client certificates are checked against)",
                    );
                }
            }
            return None;
        };
        let roots = match certs::load_roots(&self.read_path(&format!("{key}.client_ca"), written)) {
            Ok(roots) => Arc::new(roots),
            Err(problems) => {
                for p in problems {
                    self.problem(&format!("{key}.client_ca"), p);
                }
                return None;
            }
        };
        let crls = self.client_crls(key, raw.client_crl.as_deref())?;
        let ca = ClientCa { roots, auth, crls };
        if let Err(why) = crate::tls::crls_taken(&ca) {
            let written = raw.client_crl.as_deref().unwrap_or_default();
            self.problem(&format!("{key}.client_crl"), format!("{written}: {why}"));
            return None;
        }
        Some(ca)
    }

    /// `client_crl`'s revocation lists (none if it is not set).
    fn client_crls(
        &mut self,
        key: &str,
        written: Option<&str>,
    ) -> Option<Vec<rustls_pki_types::CertificateRevocationListDer<'static>>> {
        let Some(written) = written else {
            return Some(Vec::new());
        };
        let crl_key = format!("{key}.client_crl");
        let path = self.read_path(&crl_key, written);
        match certs::load_crls(&path) {
            Ok(crls) => {
                self.crls_checked(&crl_key, &path, &crls);
                Some(crls)
            }
            Err(p) => {
                self.problem(&crl_key, p);
                None
            }
        }
    }

    /// Two lists of one issuer are refused (webpki reads the first alone:
    /// a newer list appended after an older one would never be read); a
    /// list past its next update is a warning (nginx and HAProxy, through
    /// OpenSSL, refuse it; rustls uses it: the job that refreshes it may
    /// have stopped).
    fn crls_checked(
        &mut self,
        key: &str,
        path: &std::path::Path,
        crls: &[rustls_pki_types::CertificateRevocationListDer<'static>],
    ) {
        let now = crate::tls::unix_seconds(std::time::SystemTime::now());
        let mut issuers: Vec<Vec<u8>> = Vec::new();
        for (index, crl) in crls.iter().enumerate() {
            let Some((issuer, next_update)) = certs::crl_facts(crl) else {
                continue;
            };
            if let Some(first) = issuers.iter().position(|i| *i == issuer) {
                self.problem(
                    key,
                    format!("{} holds lists {} and {} of one issuer; webpki reads the first alone, so keep one list a CA", path.display(), first + 1, index + 1),
                );
            }
            issuers.push(issuer);
            if let Some(at) = next_update.filter(|at| *at < now) {
                self.warning(
                    key,
                    format!("{}: list {}'s next update was {}: the job that refreshes it may have stopped (it is used all the same)", path.display(), index + 1, crate::tls::format_time(at)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::{parse, Config, ConfigError, Overrides};
    use crate::tls::testing::Pki;
    use crate::tls::{ClientAuth, MinVersion};

    /// The system's bundle is where this distribution keeps it, or where
    /// `SSL_CERT_FILE` says (it was Debian's path alone: a pool's `tls`
    /// without `ca` was refused on Fedora or SUSE).
    #[test]
    fn the_system_bundle_is_found_where_the_distribution_keeps_it() {
        use std::path::{Path, PathBuf};
        let only = |kept: &'static str| move |p: &Path| p == Path::new(kept);
        assert_eq!(
            super::system_bundle(None, only("/etc/pki/tls/certs/ca-bundle.crt")),
            PathBuf::from("/etc/pki/tls/certs/ca-bundle.crt")
        );
        assert_eq!(
            super::system_bundle(None, only("/etc/ssl/ca-bundle.pem")),
            PathBuf::from("/etc/ssl/ca-bundle.pem")
        );
        assert_eq!(
            super::system_bundle(Some("/opt/ca.pem".into()), only("/etc/ssl/ca-bundle.pem")),
            PathBuf::from("/opt/ca.pem")
        );
        assert_eq!(
            super::system_bundle(None, |_| false),
            PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            "none: the first, named in the problem"
        );
    }

    /// A folder with a CA (`ca.pem`) and a good leaf (`a.pem`, `a.key`) for
    /// `a.example.com` and `*.a.example.com`.
    fn pki() -> Pki {
        let pki = Pki::new();
        let leaf = pki.leaf(
            "a.example.com",
            &["a.example.com", "*.a.example.com"],
            -1..90,
        );
        pki.write("a.pem", &leaf.chain());
        pki.write("a.key", &leaf.key);
        pki.write("ca.pem", &leaf.ca);
        pki
    }

    /// A config in the folder with one listener whose `tls` is `tls`.
    fn load(pki: &Pki, protocol: &str, tls: &str) -> Result<Config, ConfigError> {
        parse_in(pki, &format!(
            "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8443\"\nprotocol = \"{protocol}\"\npool = \"app\"\ntls = {tls}\n\n[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        ))
    }

    /// `text` loaded as a config file in the folder (relative paths in it
    /// name the folder's files).
    fn parse_in(pki: &Pki, text: &str) -> Result<Config, ConfigError> {
        parse(
            text,
            &pki.dir.path().join("baton.toml"),
            &Overrides::default(),
        )
    }

    /// The problems of a config that must be invalid.
    fn invalid(loaded: Result<Config, ConfigError>) -> Vec<String> {
        match loaded {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    fn problems(pki: &Pki, protocol: &str, tls: &str) -> Vec<String> {
        invalid(load(pki, protocol, tls))
    }

    const A: &str = r#"{ cert = "a.pem", key = "a.key" }"#;

    #[test]
    fn defaults_fill_a_tls_key_with_only_a_certificate() {
        let pki = pki();
        let c = load(&pki, "http", &format!("{{ certificates = [{A}] }}")).expect("valid");
        let tls = c.listeners[0].tls.as_ref().expect("tls");
        assert_eq!(tls.alpn, ["h2", "http/1.1"]);
        assert_eq!(
            tls.server_config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert_eq!(tls.min_version, MinVersion::Tls12);
        assert_eq!(tls.handshake_timeout, Duration::from_secs(10));
        assert_eq!(tls.client_auth, None);
        assert_eq!(tls.certificates[0].name, "a.example.com");
        assert_eq!(
            tls.certificates[0].names,
            ["a.example.com", "*.a.example.com"]
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let tcp = load(&pki, "tcp", &format!("{{ certificates = [{A}] }}")).expect("valid");
        assert!(tcp.listeners[0].tls.as_ref().expect("tls").alpn.is_empty());
    }

    #[test]
    fn every_tls_key_is_read() {
        let pki = pki();
        pki.leaf_files("b", "b.example.org", -1..90);
        let tls = r#"{ certificates = [{ cert = "a.pem", key = "a.key" }, { cert = "b.pem", key = "b.key" }], alpn = ["http/1.1"], min_version = "1.3", handshake_timeout = "3s", client_ca = "ca.pem", client_auth = "optional" }"#;
        let c = load(&pki, "http", tls).expect("valid");
        let tls = c.listeners[0].tls.as_ref().expect("tls");
        assert_eq!(tls.alpn, ["http/1.1"]);
        assert_eq!(tls.min_version, MinVersion::Tls13);
        assert_eq!(tls.handshake_timeout, Duration::from_secs(3));
        assert_eq!(tls.client_auth, Some(ClientAuth::Optional));
        assert_eq!(tls.certificates[1].names, ["b.example.org"]);
        let tcp = load(
            &pki,
            "tcp",
            &format!("{{ certificates = [{A}], alpn = [\"x-db\"] }}"),
        );
        assert_eq!(
            tcp.expect("valid").listeners[0]
                .tls
                .as_ref()
                .expect("tls")
                .alpn,
            ["x-db"]
        );
    }

    #[test]
    fn problems_name_their_keys() {
        let pki = pki();
        let tls = format!(
            r#"{{ certificates = [{A}, {{ cert = "none.pem", key = "a.key" }}], alpn = ["h3"], min_version = "1.1", client_auth = "required" }}"#
        );
        let p = problems(&pki, "http", &tls);
        let missing = pki.dir.path().join("none.pem");
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(
            p[0].starts_with("listeners[0].tls.certificates[1].cert: cannot read: "),
            "{p:?}"
        );
        assert!(
            p[0].ends_with(&format!("(file {})", missing.display())),
            "{p:?}"
        );
        assert!(p[1].starts_with("listeners[0].tls.alpn[0]: \"h3\" is not one of h2, http/1.1"));
        assert_eq!(
            p[2],
            "listeners[0].tls.min_version: \"1.1\" is not one of 1.2, 1.3"
        );
        assert!(
            p[3].starts_with("listeners[0].tls.client_auth: needs client_ca"),
            "{p:?}"
        );
    }

    /// `client_crl` needs `client_ca`; a file holding no revocation list
    /// (here a certificate) is refused, naming the key.
    #[test]
    fn a_client_crl_needs_a_client_ca_and_a_revocation_list() {
        let pki = pki();
        let alone = format!(r#"{{ certificates = [{A}], client_crl = "ca.pem" }}"#);
        let p = problems(&pki, "http", &alone);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("listeners[0].tls.client_crl: needs client_ca"),
            "{p:?}"
        );
        let wrong =
            format!(r#"{{ certificates = [{A}], client_ca = "ca.pem", client_crl = "ca.pem" }}"#);
        let p = problems(&pki, "http", &wrong);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("listeners[0].tls.client_crl: ")
                && p[0].contains("holds no PEM certificate revocation list"),
            "{p:?}"
        );
    }

    #[test]
    fn a_key_of_another_certificate_is_named_by_its_key_path() {
        let pki = pki();
        let key = pki.leaf_files("b", "b.example.org", -1..90);
        let tls = format!(r#"{{ certificates = [{A}, {{ cert = "a.pem", key = "b.key" }}] }}"#);
        let p = problems(&pki, "http", &tls);
        let expected = format!(
            "listeners[0].tls.certificates[1].key: does not match the certificate in {} (file {})",
            key.with_file_name("a.pem").display(),
            key.display()
        );
        assert_eq!(p, [expected]);
    }

    /// Loads, served: a warning names it with its date.
    #[test]
    fn an_expired_certificate_loads_with_a_warning_naming_its_date() {
        let pki = pki();
        pki.leaf_files("old", "old.example.com", -30..-2);
        let tls = r#"{ certificates = [{ cert = "old.pem", key = "old.key" }] }"#;
        let c = load(&pki, "tcp", tls).expect("valid");
        let w = &c.warnings;
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("listeners[0].tls.certificates[0].cert: expired on 20"),
            "{w:?}"
        );
        assert!(w[0].ends_with("old.pem)"), "{w:?}");
    }

    #[test]
    fn a_certificate_expiring_soon_loads_with_a_warning_naming_its_key() {
        let pki = pki();
        pki.leaf_files("soon", "soon.example.com", -1..5);
        let tls = r#"{ certificates = [{ cert = "soon.pem", key = "soon.key" }] }"#;
        let c = load(&pki, "http", tls).expect("valid");
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].starts_with("listeners[0].tls.certificates[0].cert: expires on "),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn a_tls_key_needs_a_certificate_and_knows_its_keys() {
        let pki = pki();
        let p = problems(&pki, "http", "{ alpn = [\"h2\"] }");
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("listeners[0].tls.certificates: needs at least one"));
        let err = load(
            &pki,
            "http",
            &format!("{{ certificates = [{A}], ciphers = [] }}"),
        );
        assert_eq!(invalid(err), ["listeners[0].tls.ciphers: unknown key"]);
    }

    /// A config in the folder with a plain listener and a pool whose
    /// `tls` is `tls`.
    fn load_pool(pki: &Pki, tls: &str) -> Result<Config, ConfigError> {
        parse_in(pki, &format!(
            "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\npool = \"app\"\n\n[[pools]]\nname = \"app\"\ntls = {tls}\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        ))
    }

    #[test]
    fn a_pool_tls_key_is_read_and_its_problems_named() {
        let pki = pki();
        let c = load_pool(
            &pki,
            r#"{ server_name = "backend.example.org", ca = "ca.pem" }"#,
        )
        .expect("valid");
        assert!(c.pools[0].tls.as_ref().expect("tls").verify);
        let c = load_pool(&pki, "{ verify = false }").expect("valid without roots");
        assert!(!c.pools[0].tls.as_ref().expect("tls").verify);
        let problems = invalid(load_pool(
            &pki,
            r#"{ ca = "missing.pem", server_name = "not a name!" }"#,
        ));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("pools[0].tls.server_name:")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.starts_with("pools[0].tls.ca:")),
            "both at once: {problems:?}"
        );
        let problems = invalid(load_pool(&pki, r#"{ ca = "missing.pem" }"#));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("pools[0].tls.ca:") && p.contains("missing.pem")),
            "{problems:?}"
        );
    }
}
