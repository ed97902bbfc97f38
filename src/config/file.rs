//! The serde mirror of `baton.toml`: exactly the shape an operator writes.
//! Keys it does not know are collected as it is read (`super::parse`, with
//! `serde_ignored`), so every one is named, with the rest of the file's
//! problems, rather than only the first. Nothing here is checked beyond
//! types; `validate` turns this into a [`super::Config`] and names every
//! problem by its key path.

use serde::Deserialize;

/// A duration as written in the file: `"250ms"`, `"5s"`, `"-1s"`, or a bare
/// integer number of seconds (so `0` can be written without quotes).
#[derive(Debug, Clone, PartialEq)]
pub enum DurationValue {
    Text(String),
    Seconds(i64),
}

/// By hand, not `#[serde(untagged)]`: a value of another type is then
/// refused saying what a duration looks like, where untagged said only
/// that it "did not match any variant of untagged enum DurationValue".
impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DurationVisitor)
    }
}

struct DurationVisitor;

impl serde::de::Visitor<'_> for DurationVisitor {
    type Value = DurationValue;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(r#"a duration such as "250ms", "5s" or "2m", or a whole number of seconds"#)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<DurationValue, E> {
        Ok(DurationValue::Text(text.to_string()))
    }

    fn visit_i64<E: serde::de::Error>(self, seconds: i64) -> Result<DurationValue, E> {
        Ok(DurationValue::Seconds(seconds))
    }

    fn visit_u64<E: serde::de::Error>(self, seconds: u64) -> Result<DurationValue, E> {
        i64::try_from(seconds)
            .map(DurationValue::Seconds)
            .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(seconds), &self))
    }
}

/// A count as written in the file (`weight = 2`, `backlog = 1024`): read by
/// hand so a quoted or fractional value is refused saying what goes there,
/// where a plain `i64` said "expected i64".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Whole(pub i64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WholeVisitor)
    }
}

struct WholeVisitor;

impl serde::de::Visitor<'_> for WholeVisitor {
    type Value = Whole;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a whole number written without quotes, e.g. 2")
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Whole, E> {
        Ok(Whole(n))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Whole, E> {
        i64::try_from(n)
            .map(Whole)
            .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct FileConfig {
    pub workers: Option<Whole>,
    pub pin_workers: Option<bool>,
    pub busy_poll: Option<DurationValue>,
    #[serde(default)]
    pub admin: AdminFile,
    #[serde(default)]
    pub control: ControlFile,
    #[serde(default)]
    pub shutdown: ShutdownFile,
    #[serde(default)]
    pub reload: ReloadFile,
    #[serde(default)]
    pub tls: TlsGlobalFile,
    #[serde(default)]
    pub resolver: ResolverFile,
    #[serde(default, deserialize_with = "listener_tables")]
    pub listeners: Vec<ListenerFile>,
    #[serde(default, deserialize_with = "pool_tables")]
    pub pools: Vec<PoolFile>,
}

/// `[listeners]` written with one bracket is a single table where a list
/// of them goes: said so, where serde said "expected a sequence".
fn listener_tables<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ListenerFile>, D::Error> {
    d.deserialize_seq(Tables(
        "[[listeners]] tables (two brackets: one table per listener)",
        std::marker::PhantomData,
    ))
}

fn pool_tables<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PoolFile>, D::Error> {
    d.deserialize_seq(Tables(
        "[[pools]] tables (two brackets: one table per pool)",
        std::marker::PhantomData,
    ))
}

/// A list of tables, and what to call it when something else came.
struct Tables<T>(&'static str, std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Tables<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element()? {
            out.push(item);
        }
        Ok(out)
    }
}

/// `[resolver]`: the name servers named backends are looked up on.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [resolver]")]
pub struct ResolverFile {
    pub nameservers: Option<Vec<String>>,
    pub timeout: Option<DurationValue>,
}

/// `[tls]`: what every TLS listener shares.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [tls]")]
pub struct TlsGlobalFile {
    pub ticket_rotation: Option<DurationValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [admin]")]
pub struct AdminFile {
    pub listen: Option<String>,
    pub liveness_paths: Option<Vec<String>>,
    pub readiness_paths: Option<Vec<String>>,
    pub token_file: Option<String>,
    pub allow_remote_without_token: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [control]")]
pub struct ControlFile {
    pub socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [shutdown]")]
pub struct ShutdownFile {
    pub pre_stop_delay: Option<DurationValue>,
    pub drain_timeout: Option<DurationValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [reload]")]
pub struct ReloadFile {
    pub ready_timeout: Option<DurationValue>,
    pub drain_timeout: Option<DurationValue>,
    pub max_draining: Option<Whole>,
    pub close_spread: Option<DurationValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [[listeners]] (two brackets: one table per listener)")]
pub struct ListenerFile {
    pub name: Option<String>,
    pub bind: Option<String>,
    pub protocol: Option<String>,
    pub pool: Option<String>,
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    pub reuseport: Option<Whole>,
    pub backlog: Option<Whole>,
    pub defer_accept: Option<bool>,
    pub max_connections: Option<Whole>,
    pub header_timeout: Option<DurationValue>,
    pub idle_timeout: Option<DurationValue>,
    pub keepalive_drain_grace: Option<DurationValue>,
    pub connect_timeout: Option<DurationValue>,
    pub response_timeout: Option<DurationValue>,
    pub tunnel_timeout: Option<DurationValue>,
    pub body_min_rate: Option<Whole>,
    pub forwarded: Option<String>,
    pub h2_max_concurrent_streams: Option<Whole>,
    pub tls: Option<TlsFile>,
    pub proxy_protocol: Option<ProxyProtocolFile>,
    pub access_log: Option<AccessLogFile>,
}

/// A listener's `access_log`.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { path = \"/var/log/baton/access.log\", format = \"json\" }")]
pub struct AccessLogFile {
    pub path: Option<String>,
    pub format: Option<String>,
}

/// A listener's `proxy_protocol`: PROXY headers from a balancer in front.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { trusted = [\"10.0.0.0/8\"] }")]
pub struct ProxyProtocolFile {
    pub accept: Option<String>,
    pub trusted: Option<Vec<String>>,
    pub required: Option<bool>,
    pub timeout: Option<DurationValue>,
}

/// A listener's `tls` key: an inline table or `[listeners.tls]`.
#[derive(Debug, Default, Deserialize)]
#[serde(
    expecting = "a table, e.g. { certificates = [{ cert = \"cert.pem\", key = \"key.pem\" }] }"
)]
pub struct TlsFile {
    #[serde(default)]
    pub certificates: Vec<CertificateFile>,
    pub alpn: Option<Vec<String>>,
    pub min_version: Option<String>,
    pub handshake_timeout: Option<DurationValue>,
    pub client_ca: Option<String>,
    pub client_auth: Option<String>,
    pub client_crl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { cert = \"cert.pem\", key = \"key.pem\" }")]
pub struct CertificateFile {
    pub cert: Option<String>,
    pub key: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { path_prefix = \"/api\", pool = \"api\" }")]
pub struct RouteFile {
    pub path_prefix: Option<String>,
    pub host: Option<String>,
    pub pool: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table: [[pools]] (two brackets: one table per pool)")]
pub struct PoolFile {
    pub name: Option<String>,
    pub balance: Option<String>,
    pub health: Option<HealthFile>,
    #[serde(default)]
    pub backends: Vec<BackendFile>,
    pub max_connections_per_backend: Option<Whole>,
    pub queue_timeout: Option<DurationValue>,
    pub tls: Option<UpstreamTlsFile>,
    pub send_proxy: Option<String>,
    pub srv: Option<String>,
    pub resolve_interval: Option<DurationValue>,
}

/// A pool's `tls`: how its backends are reached over TLS.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { server_name = \"app.internal\" }")]
pub struct UpstreamTlsFile {
    pub server_name: Option<String>,
    pub ca: Option<String>,
    pub verify: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { kind = \"http\", path = \"/health\", interval = \"2s\" }")]
pub struct HealthFile {
    pub kind: Option<String>,
    pub path: Option<String>,
    pub host: Option<String>,
    pub interval: Option<DurationValue>,
    pub timeout: Option<DurationValue>,
    pub rise: Option<Whole>,
    pub fall: Option<Whole>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table, e.g. { name = \"a\", address = \"10.0.0.5:8080\", weight = 1 }")]
pub struct BackendFile {
    pub name: Option<String>,
    pub address: Option<String>,
    pub weight: Option<Whole>,
}
