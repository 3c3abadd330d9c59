//! The metrics endpoint (`--metrics-listen`): a minimal HTTP/1.x server answering
//! `GET /metrics` with the text format, and `GET /healthz` and `GET /readyz` with the node's
//! health as `grpc.health.v1` judges it (200 or 503; for probes that cannot speak TLS, such
//! as Kubernetes' gRPC probe against a TLS node), one request per connection. Bounded: at most
//! `METRICS_CONNECTIONS_MAX` connections at once (more are closed unanswered), a request head
//! of at most `METRICS_REQUEST_BYTES_MAX` bytes, and `METRICS_REQUEST_TIMEOUT_MS` to read the
//! request and send the answer. Knows nothing of what the metrics are.

use std::sync::Arc;
use std::time::Duration;

use keel_types::limits::{
    METRICS_CONNECTIONS_MAX, METRICS_REQUEST_BYTES_MAX, METRICS_REQUEST_TIMEOUT_MS,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::api::health;
use crate::metrics::text::CONTENT_TYPE;
use crate::shared::Shared;

mod scrape;

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Asked {
    Metrics,
    /// `/healthz`: the node is healthy (what `keel.raft.v1.Raft`'s health status says).
    Live,
    /// `/readyz`: healthy, and every range hosted knows a leader (the `""` status).
    Ready,
    /// Another path: 404.
    NotFound,
    /// Another method: 405.
    MethodNotAllowed,
    /// Not an HTTP/1.x request line, or a head too large: 400.
    BadRequest,
}

/// Serves scrapes until the task is aborted (the connections' tasks with it).
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    serve_subject(listener, shared).await
}

/// What the endpoint reports on: the node (`Shared`), or a stand-in in the tests.
trait Subject: Send + Sync + 'static {
    /// The metrics in the text format.
    fn metrics(&self) -> impl Future<Output = String> + Send;
    /// For `/healthz`: whether the node is healthy, else why not.
    fn live(&self) -> Result<(), String>;
    /// For `/readyz`: whether the node is ready, else why not.
    fn ready(&self) -> Result<(), String>;
}

impl Subject for Shared {
    async fn metrics(&self) -> String {
        scrape::render(self).await
    }

    fn live(&self) -> Result<(), String> {
        match self.health.summary() {
            (true, _) => Ok(()),
            (false, message) => Err(message),
        }
    }

    fn ready(&self) -> Result<(), String> {
        health::verdict(self)
    }
}

/// `serve`, for any subject.
async fn serve_subject<S: Subject>(listener: TcpListener, subject: Arc<S>) {
    let permits = Arc::new(Semaphore::new(METRICS_CONNECTIONS_MAX));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        warn!(%error, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    debug!(%peer, "metrics endpoint: too many connections; closing one");
                    continue;
                };
                let subject = subject.clone();
                connections.spawn(async move {
                    let limit = Duration::from_millis(METRICS_REQUEST_TIMEOUT_MS);
                    if tokio::time::timeout(limit, answer(stream, &*subject)).await.is_err() {
                        debug!(%peer, "metrics endpoint: request timed out");
                    }
                    drop(permit);
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Reads one request and answers it.
async fn answer<S: Subject>(mut stream: TcpStream, subject: &S) {
    let asked = match read_head(&mut stream).await {
        Ok(head) => parse(&head),
        Err(_) => return,
    };
    let (status, content_type, body) = match asked {
        Asked::Metrics => ("200 OK", CONTENT_TYPE, subject.metrics().await),
        Asked::Live => probe(subject.live()),
        Asked::Ready => probe(subject.ready()),
        Asked::NotFound => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
        Asked::MethodNotAllowed => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
        Asked::BadRequest => ("400 Bad Request", "text/plain", "bad request\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let written = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    if let Err(error) = written.await {
        debug!(%error, "metrics endpoint: writing the answer failed");
    }
}

/// A probe's answer: 200 `ok`, or 503 with the reason.
fn probe(verdict: Result<(), String>) -> (&'static str, &'static str, String) {
    match verdict {
        Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
        Err(reason) => (
            "503 Service Unavailable",
            "text/plain",
            format!("{reason}\n"),
        ),
    }
}

/// The request head, up to the empty line; a head longer than the limit is cut there (and
/// then fails to parse).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        if head.len() >= METRICS_REQUEST_BYTES_MAX {
            head.truncate(METRICS_REQUEST_BYTES_MAX);
            return Ok(head);
        }
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    Ok(head)
}

/// What the request head asks for (pure; table tests).
pub(crate) fn parse(head: &[u8]) -> Asked {
    let complete = head.windows(4).any(|window| window == b"\r\n\r\n");
    let Some(line) = head.split(|byte| *byte == b'\n').next() else {
        return Asked::BadRequest;
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return Asked::BadRequest;
    };
    let parts: Vec<&str> = line.trim_end_matches('\r').split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Asked::BadRequest;
    };
    if !complete || !version.starts_with("HTTP/1.") {
        return Asked::BadRequest;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Asked::Metrics,
        ("GET", "/healthz") => Asked::Live,
        ("GET", "/readyz") => Asked::Ready,
        ("GET", _) => Asked::NotFound,
        _ => Asked::MethodNotAllowed,
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn requests_are_parsed_strictly() {
        let too_long = format!(
            "GET /metrics HTTP/1.1\r\nX: {}",
            "a".repeat(METRICS_REQUEST_BYTES_MAX)
        );
        let cases: Vec<(&str, Asked)> = vec![
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", Asked::Metrics),
            ("GET /metrics HTTP/1.0\r\n\r\n", Asked::Metrics),
            ("GET /metrics?name[]=x HTTP/1.1\r\n\r\n", Asked::Metrics),
            ("GET /healthz HTTP/1.1\r\n\r\n", Asked::Live),
            ("GET /readyz HTTP/1.1\r\n\r\n", Asked::Ready),
            ("GET / HTTP/1.1\r\n\r\n", Asked::NotFound),
            ("GET /metricsx HTTP/1.1\r\n\r\n", Asked::NotFound),
            ("POST /metrics HTTP/1.1\r\n\r\n", Asked::MethodNotAllowed),
            ("GET /metrics HTTP/2\r\n\r\n", Asked::BadRequest),
            ("GET /metrics\r\n\r\n", Asked::BadRequest),
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n", Asked::BadRequest),
            ("", Asked::BadRequest),
            (&too_long[..METRICS_REQUEST_BYTES_MAX], Asked::BadRequest),
        ];
        for (head, expected) in cases {
            assert_eq!(parse(head.as_bytes()), expected, "{head:?}");
        }
    }

    const METRICS: &str = "keel_up 1\n";

    /// The node's stand-in: live, not ready.
    struct Stub;

    impl Subject for Stub {
        async fn metrics(&self) -> String {
            METRICS.to_string()
        }

        fn live(&self) -> Result<(), String> {
            Ok(())
        }

        fn ready(&self) -> Result<(), String> {
            Err("range 1 has no leader".to_string())
        }
    }

    /// Where an endpoint serving `Stub` listens, until the test's runtime ends.
    async fn start() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_subject(listener, Arc::new(Stub)));
        addr
    }

    /// Sends `request` on a new connection, ends the sending side, and reads until the
    /// endpoint closes: its answer, or "" when it closed unanswered (a close that leaves the
    /// request unread reaches the client as a reset).
    async fn ask(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut answer = Vec::new();
        let exchange = async {
            stream.write_all(request.as_bytes()).await?;
            stream.shutdown().await?;
            stream.read_to_end(&mut answer).await
        };
        match exchange.await {
            Ok(_) => {}
            Err(error) if error.kind() == ErrorKind::ConnectionReset => {}
            Err(error) => panic!("{request:?}: {error}"),
        }
        String::from_utf8(answer).unwrap()
    }

    /// An answer as the endpoint writes it.
    fn http(status: &str, content_type: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn requests_are_answered_strictly() {
        let addr = start().await;
        let metrics = http("200 OK", CONTENT_TYPE, METRICS);
        let live = http("200 OK", "text/plain", "ok\n");
        let not_ready = http(
            "503 Service Unavailable",
            "text/plain",
            "range 1 has no leader\n",
        );
        let not_found = http("404 Not Found", "text/plain", "try /metrics\n");
        let not_allowed = http("405 Method Not Allowed", "text/plain", "GET only\n");
        let bad = http("400 Bad Request", "text/plain", "bad request\n");
        let too_long = format!(
            "GET /metrics HTTP/1.1\r\nX: {}",
            "a".repeat(METRICS_REQUEST_BYTES_MAX)
        );
        let cases = [
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", metrics.clone()),
            ("GET /metrics HTTP/1.0\r\n\r\n", metrics.clone()),
            ("GET /metrics?name[]=x HTTP/1.1\r\n\r\n", metrics.clone()),
            ("GET /healthz HTTP/1.1\r\n\r\n", live),
            ("GET /readyz HTTP/1.1\r\n\r\n", not_ready),
            ("GET / HTTP/1.1\r\n\r\n", not_found.clone()),
            ("GET /metricsx HTTP/1.1\r\n\r\n", not_found),
            ("POST /metrics HTTP/1.1\r\n\r\n", not_allowed.clone()),
            ("HEAD /metrics HTTP/1.1\r\n\r\n", not_allowed),
            ("GET /metrics HTTP/2\r\n\r\n", bad.clone()),
            ("GET /metrics\r\n\r\n", bad.clone()),
            ("hello\r\n\r\n", bad.clone()),
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n", bad.clone()),
            ("", bad.clone()),
            (&too_long[..METRICS_REQUEST_BYTES_MAX], bad),
        ];
        for (request, expected) in cases {
            assert_eq!(ask(addr, request).await, expected, "{request:?}");
        }
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_are_closed_unanswered() {
        let addr = start().await;
        let mut idle = Vec::new();
        for _ in 0..METRICS_CONNECTIONS_MAX {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let request = "GET /metrics HTTP/1.1\r\n\r\n";
        assert_eq!(ask(addr, request).await, "");
        // The endpoint frees a connection's slot once it sees the close: ask until it has.
        drop(idle.pop());
        let mut answer = String::new();
        for _ in 0..500 {
            answer = ask(addr, request).await;
            if !answer.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(answer, http("200 OK", CONTENT_TYPE, METRICS));
    }
}
