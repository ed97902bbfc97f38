//! hyper's client (which carries h2 clients' streams to backends) connects
//! through [`stream::connect`], so a pool's TLS and connect timeout apply
//! to those streams as to every other way to a backend. One connector per
//! pool: it holds that pool's TLS.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;

use super::stream::{self, BackendStream};
use crate::tls::upstream::UpstreamTls;

#[derive(Clone)]
pub struct Connector {
    pub tls: Option<Arc<UpstreamTls>>,
    pub timeout: Duration,
}

/// A backend connection as hyper's client holds it.
pub struct Connecting(TokioIo<BackendStream>);

impl tower_service::Service<Uri> for Connector {
    type Response = Connecting;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Connecting>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Backends are addresses (`ip:port`), so the URI's authority is one.
    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let address = uri
                .authority()
                .and_then(|a| a.as_str().parse().ok())
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "not a backend address")
                })?;
            stream::connect(address, this.tls.as_deref(), this.timeout, None)
                .await
                .map(|s| Connecting(TokioIo::new(s)))
                .map_err(|fault| io::Error::other(fault.to_string()))
        })
    }
}

impl Connection for Connecting {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Connecting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Connecting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
