//! A backend behind `send_proxy`: every connection must open with a PROXY
//! header (parsed here with the `ppp` crate on its own, not with baton's
//! framing); it records what each header said, then serves HTTP/1 on the
//! rest, answering each request with its connection's number. A
//! connection without a valid header is closed and recorded as such.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use ppp::{v1, v2, HeaderResult};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// What one connection's PROXY header said.
#[derive(Debug, Clone, PartialEq)]
pub enum Told {
    /// A client's addresses (and, in v2, the TLVs: kind, value).
    Client {
        source: SocketAddr,
        destination: SocketAddr,
        tlvs: Vec<(u8, Vec<u8>)>,
    },
    /// v2 `LOCAL` or v1 `UNKNOWN`: baton on its own behalf.
    Local,
    /// No valid header.
    Invalid(String),
}

/// One request as served: its connection's number and its `X-Request-Id`.
#[derive(Debug, Clone)]
pub struct Served {
    pub connection: usize,
    pub request_id: Option<String>,
}

#[derive(Default)]
struct Record {
    told: Mutex<Vec<Told>>,
    served: Mutex<Vec<Served>>,
    open: AtomicUsize,
}

pub struct ProxiedBackend {
    pub addr: SocketAddr,
    record: Arc<Record>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for ProxiedBackend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ProxiedBackend {
    pub async fn start() -> ProxiedBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let record = Arc::new(Record::default());
        let stop = tokio_util::sync::CancellationToken::new();
        let (kept, stopped) = (Arc::clone(&record), stop.clone());
        tokio::spawn(async move {
            loop {
                let Some(stream) = super::accept_until(&listener, &stopped).await else {
                    return;
                };
                let (record, stopped) = (Arc::clone(&kept), stopped.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = serve(stream, record) => {}
                        () = stopped.cancelled() => {}
                    }
                });
            }
        });
        ProxiedBackend { addr, record, stop }
    }

    /// Each connection's header, in the order they arrived.
    pub fn told(&self) -> Vec<Told> {
        self.record
            .told
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// The headers that named a client (health checks' left out).
    pub fn clients(&self) -> Vec<Told> {
        self.told()
            .into_iter()
            .filter(|t| matches!(t, Told::Client { .. }))
            .collect()
    }

    pub fn served(&self) -> Vec<Served> {
        self.record
            .served
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.record.open.load(Ordering::Relaxed)
    }
}

async fn serve(mut stream: TcpStream, record: Arc<Record>) {
    let told = read_header(&mut stream).await;
    let connection = {
        let Ok(mut all) = record.told.lock() else {
            return;
        };
        all.push(told.clone());
        all.len() - 1
    };
    if matches!(told, Told::Invalid(_)) {
        return;
    }
    record.open.fetch_add(1, Ordering::Relaxed);
    let served = Arc::clone(&record);
    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
        let request_id = req
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        if let Ok(mut s) = served.served.lock() {
            s.push(Served {
                connection,
                request_id,
            });
        }
        async move {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                "connection {connection}"
            )))))
        }
    });
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
    record.open.fetch_sub(1, Ordering::Relaxed);
}

/// Reads exactly one header: a v1 line up to its CRLF, or v2's 16 bytes
/// and the length they give.
async fn read_header(stream: &mut TcpStream) -> Told {
    let mut bytes = vec![0u8; 16];
    if stream.read_exact(&mut bytes[..1]).await.is_err() {
        return Told::Invalid("closed".into());
    }
    let read = if bytes[0] == b'P' {
        bytes.truncate(1);
        read_line(stream, &mut bytes).await
    } else {
        read_binary(stream, &mut bytes).await
    };
    if let Err(e) = read {
        return Told::Invalid(e.to_string());
    }
    match HeaderResult::parse(&bytes) {
        HeaderResult::V1(Ok(h)) => match h.addresses {
            v1::Addresses::Tcp4(a) => client(
                (a.source_address, a.source_port).into(),
                (a.destination_address, a.destination_port).into(),
                Vec::new(),
            ),
            v1::Addresses::Tcp6(a) => client(
                (a.source_address, a.source_port).into(),
                (a.destination_address, a.destination_port).into(),
                Vec::new(),
            ),
            v1::Addresses::Unknown => Told::Local,
        },
        HeaderResult::V2(Ok(h)) => {
            let tlvs = h
                .tlvs()
                .flatten()
                .map(|t| (t.kind, t.value.to_vec()))
                .collect();
            match (h.command, h.addresses) {
                (v2::Command::Local, _) => Told::Local,
                (_, v2::Addresses::IPv4(a)) => client(
                    (a.source_address, a.source_port).into(),
                    (a.destination_address, a.destination_port).into(),
                    tlvs,
                ),
                (_, v2::Addresses::IPv6(a)) => client(
                    (a.source_address, a.source_port).into(),
                    (a.destination_address, a.destination_port).into(),
                    tlvs,
                ),
                (_, other) => Told::Invalid(format!("addresses {other:?}")),
            }
        }
        other => Told::Invalid(format!("{other:?}")),
    }
}

fn client(source: SocketAddr, destination: SocketAddr, tlvs: Vec<(u8, Vec<u8>)>) -> Told {
    Told::Client {
        source,
        destination,
        tlvs,
    }
}

async fn read_line(stream: &mut TcpStream, bytes: &mut Vec<u8>) -> std::io::Result<()> {
    while !bytes.ends_with(b"\r\n") && bytes.len() < 108 {
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).await?;
        bytes.push(one[0]);
    }
    Ok(())
}

async fn read_binary(stream: &mut TcpStream, bytes: &mut Vec<u8>) -> std::io::Result<()> {
    stream.read_exact(&mut bytes[1..16]).await?;
    let length = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    bytes.resize(16 + length, 0);
    stream.read_exact(&mut bytes[16..]).await?;
    Ok(())
}
