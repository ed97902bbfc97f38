//! A whole h2 connection driven by one input: the preface and the input's
//! bytes from a client that then closes its side and reads everything
//! sent, behind an exchange that reads each request's body to its end and
//! answers a short body. Shared by the `h2_conn` fuzz target and the
//! replay of its inputs in `tests/fuzz_regressions.rs`.

use std::time::Duration;

use baton::proxy::h2::conn::{Connection, Exchange, Limits};
use baton::proxy::h2::frame::PREFACE;
use baton::proxy::h2::recv::RecvBody;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn limits() -> Limits {
    Limits {
        max_streams: 8,
        stream_window: 64 * 1024,
        connection_window: 256 * 1024,
        max_header_list: 16 * 1024,
        send_buffer: 32 * 1024,
        ping_interval: Duration::from_secs(30),
        ping_timeout: Duration::from_secs(20),
        stall_limit: Duration::from_secs(60),
        goaway_crossing: Duration::from_secs(1),
        block_limit: Duration::from_secs(10),
    }
}

fn exchange(request: Request<RecvBody>) -> Exchange<Full<Bytes>> {
    Box::pin(async move {
        let _ = request.into_body().collect().await;
        Response::new(Full::new(Bytes::from_static(b"ok")))
    })
}

/// Whether the connection ended within an hour (of paused time: the
/// keep-alive PING's timeout is the latest any input may take).
pub async fn connection_ends(bytes: &[u8]) -> bool {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let connection = Connection::new(server, &[], limits(), exchange);
    let feed = async {
        let _ = to_server.write_all(PREFACE).await;
        let _ = to_server.write_all(bytes).await;
        let _ = to_server.shutdown().await;
    };
    let drain = async {
        let mut sink = vec![0u8; 64 * 1024];
        while from_server.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    };
    let all = async { tokio::join!(feed, drain, connection) };
    tokio::time::timeout(Duration::from_secs(3600), all)
        .await
        .is_ok()
}
