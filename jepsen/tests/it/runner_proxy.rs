//! The fault-injecting proxy of runs without root, over a TCP echo server: traffic between
//! nodes flows, a cut closes open connections and holds new ones without a byte through, a
//! heal lets traffic through again, and clients (unknown sources) are never cut.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use keel_jepsen::run::proxy::{LinkState, Proxy, ProxyConfig, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

/// Bound on every wait of these tests (they finish long before it unless broken).
const WAIT: Duration = Duration::from_secs(10);
/// The source IP of "node 0"; the echo server is "node 1".
const NODE_0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 21);

/// Echoes every connection's bytes back until it closes.
async fn echo_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            connections.spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    (addr, task)
}

async fn connect_from(source: Ipv4Addr, target: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0)).unwrap();
    socket.connect(target).await.unwrap()
}

/// Sends `text` and reads the same number of bytes back.
async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> Vec<u8> {
    stream.write_all(text).await.unwrap();
    let mut back = vec![0; text.len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    back
}

/// Reads until the other side closes; what arrived before that.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest))
        .await
        .expect("the proxy closes the connection");
    rest
}

async fn wait_held(proxy: &Proxy, count: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while proxy.held() != count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} held, expected {count}",
            proxy.held()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn proxy_cuts_and_heals_a_link() {
    let (echo, _server) = echo_server().await;
    let upstream: Upstream = Arc::new(move || Ok(echo));
    let config = ProxyConfig {
        target: 1,
        sources: Arc::new(HashMap::from([(IpAddr::V4(NODE_0), 0)])),
        upstream,
    };
    let (links, _) = watch::channel(LinkState::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = Proxy::spawn(listener, config, links.subscribe()).unwrap();

    let mut open = connect_from(NODE_0, proxy.addr()).await;
    assert_eq!(round_trip(&mut open, b"before").await, b"before");

    links.send_modify(|state| {
        state.cut.insert((0, 1));
    });
    assert_eq!(
        read_until_closed(&mut open).await,
        b"",
        "an open connection is closed by a cut"
    );
    let mut held = connect_from(NODE_0, proxy.addr()).await;
    wait_held(&proxy, 1).await;
    held.write_all(b"lost").await.unwrap();
    let mut client = connect_from(Ipv4Addr::LOCALHOST, proxy.addr()).await;
    assert_eq!(
        round_trip(&mut client, b"client").await,
        b"client",
        "clients are never cut"
    );

    links.send_modify(|state| state.cut.clear());
    assert_eq!(
        read_until_closed(&mut held).await,
        b"",
        "held bytes never arrive"
    );
    wait_held(&proxy, 0).await;
    let mut after = connect_from(NODE_0, proxy.addr()).await;
    assert_eq!(round_trip(&mut after, b"after").await, b"after");
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_connections() {
    let (echo, _server) = echo_server().await;
    let upstream: Upstream = Arc::new(move || Ok(echo));
    let config = ProxyConfig {
        target: 0,
        sources: Arc::new(HashMap::new()),
        upstream,
    };
    let (_links, receiver) = watch::channel(LinkState::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = Proxy::spawn(listener, config, receiver).unwrap();
    let mut stream = connect_from(Ipv4Addr::LOCALHOST, proxy.addr()).await;
    assert_eq!(round_trip(&mut stream, b"x").await, b"x");
    drop(proxy);
    assert_eq!(read_until_closed(&mut stream).await, b"");
}
