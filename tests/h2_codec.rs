//! baton's h2 frames and HPACK decoder read what real h2 clients write:
//! the `h2` crate's client (hyper's; Huffman-coded strings, a dynamic table
//! the requests share, a head longer than a frame) and curl (nghttp2's
//! encoder). Each request's fields must come out as the client was asked to
//! send them.

use std::time::Duration;

use baton::proxy::h2::frame::{self, Frame, Inbound, Reader};
use baton::proxy::h2::hpack::{Decoder, Listed};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PATIENCE: Duration = Duration::from_secs(10);

/// A request's fields as text, in the order they were sent.
type Fields = Vec<(String, String)>;

/// A request to send: method, path and regular fields.
type Asked = (&'static str, String, Vec<(&'static str, String)>);

/// Reads a client's preface and frames, answering its SETTINGS with an
/// empty one of baton's side, until `count` header blocks have come; each
/// decoded in turn with one decoder, as a connection would.
async fn header_blocks(socket: &mut TcpStream, count: usize) -> Vec<Fields> {
    let mut buf = BytesMut::new();
    while buf.len() < frame::PREFACE.len() {
        assert_ne!(socket.read_buf(&mut buf).await.expect("read"), 0);
    }
    assert_eq!(&buf[..frame::PREFACE.len()], frame::PREFACE);
    let _ = buf.split_to(frame::PREFACE.len());
    let mut hello = Vec::new();
    frame::write::settings(&mut hello, &[]);
    socket.write_all(&hello).await.expect("write settings");
    let mut reader = Reader::new(frame::DEFAULT_MAX_FRAME, 1 << 20);
    let mut decoder = Decoder::new(4096);
    let mut requests = Vec::new();
    while requests.len() < count {
        let inbound = reader.next(&mut buf).expect("valid frames");
        match inbound {
            None => {
                assert_ne!(
                    socket.read_buf(&mut buf).await.expect("read"),
                    0,
                    "client closed"
                );
            }
            Some(Inbound::Frame(Frame::Settings(_))) => {
                let mut ack = Vec::new();
                frame::write::settings_ack(&mut ack);
                socket.write_all(&ack).await.expect("write ack");
            }
            Some(Inbound::Frame(_)) => {}
            Some(Inbound::Block(whole)) => {
                let mut fields = Vec::new();
                let listed = decoder.decode(&whole.block, 1 << 20, &mut fields);
                assert_eq!(listed, Ok(Listed::Whole));
                let text = |b: &[u8]| String::from_utf8(b.to_vec()).expect("utf-8");
                requests.push(
                    fields
                        .iter()
                        .map(|f| (text(&f.name), text(&f.value)))
                        .collect(),
                );
            }
        }
    }
    requests
}

fn field<'a>(fields: &'a Fields, name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[tokio::test]
async fn the_h2_crates_requests_decode_as_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let long = "v".repeat(40_000);
    let asked: Vec<Asked> = vec![
        ("GET", "/".into(), vec![("accept", "*/*".into())]),
        (
            "POST",
            "/upload?x=1".into(),
            vec![("accept", "*/*".into()), ("x-custom", "Some Value".into())],
        ),
        (
            "GET",
            "/again".into(),
            vec![("x-custom", "Some Value".into()), ("x-long", long.clone())],
        ),
        (
            "DELETE",
            "/again".into(),
            vec![("cookie", "a=1".into()), ("cookie", "b=2".into())],
        ),
    ];
    let sent = asked.clone();
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut h2, connection) = h2::client::Builder::new()
            .max_send_buffer_size(1 << 20)
            .handshake::<_, bytes::Bytes>(tcp)
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let mut streams = Vec::new();
        for (method, path, fields) in sent {
            let mut request = http::Request::builder()
                .method(method)
                .uri(format!("http://example.test{path}"));
            for (name, value) in fields {
                request = request.header(name, value);
            }
            h2 = h2.ready().await.expect("ready");
            let (response, _) = h2
                .send_request(request.body(()).expect("request"), true)
                .expect("send");
            streams.push(response);
        }
        // Held open until the test has read every head.
        tokio::time::sleep(PATIENCE).await;
        drop(streams);
    });
    let (mut socket, _) = listener.accept().await.expect("accept");
    let got = tokio::time::timeout(PATIENCE, header_blocks(&mut socket, asked.len()))
        .await
        .expect("every head in time");
    client.abort();
    for ((method, path, fields), got) in asked.iter().zip(&got) {
        assert_eq!(field(got, ":method"), [*method]);
        assert_eq!(field(got, ":path"), [path.as_str()]);
        assert_eq!(field(got, ":scheme"), ["http"]);
        assert_eq!(field(got, ":authority"), ["example.test"]);
        let regular: Vec<(&str, &str)> = got
            .iter()
            .filter(|(n, _)| !n.starts_with(':'))
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let want: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(regular, want);
    }
    assert_eq!(field(&got[2], "x-long"), [long.as_str()]);
}

#[tokio::test]
async fn curls_request_decodes_as_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let mut curl = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "--max-time",
            "10",
            "--http2-prior-knowledge",
        ])
        .args([
            "-H",
            "X-Trace: Abc-123 xyz",
            "-H",
            "Accept-Language: en-GB,en;q=0.9",
        ])
        .arg(format!("http://127.0.0.1:{port}/some/path?q=%20space"))
        .kill_on_drop(true)
        .spawn()
        .expect("curl runs");
    let (mut socket, _) = listener.accept().await.expect("accept");
    let got = tokio::time::timeout(PATIENCE, header_blocks(&mut socket, 1))
        .await
        .expect("the head in time");
    let _ = curl.kill().await;
    let got = &got[0];
    assert_eq!(field(got, ":method"), ["GET"]);
    assert_eq!(field(got, ":path"), ["/some/path?q=%20space"]);
    assert_eq!(
        field(got, ":authority"),
        [format!("127.0.0.1:{port}").as_str()]
    );
    assert_eq!(field(got, "x-trace"), ["Abc-123 xyz"]);
    assert_eq!(field(got, "accept-language"), ["en-GB,en;q=0.9"]);
    assert!(field(got, "user-agent")[0].starts_with("curl/"), "{got:?}");
}
