//! The metrics endpoint (`--metrics-listen`): `GET /metrics` answers the text format, and
//! `GET /healthz` and `GET /readyz` the node's health as `grpc.health.v1` judges it (200 or
//! 503; for probes that cannot speak TLS, such as Kubernetes' gRPC probe against a TLS node).
//! `GET /` is the console's page and `GET /console/state.json` its data (`api/console.rs`).
//! Another path is 404, another method (HEAD too) 405. Knows nothing of what the metrics are.
//!
//! HTTP/1.x is hyper's, and this file only routes: hyper answers a request it cannot parse
//! with 400, and closes unanswered a connection that ends before its request head does. One
//! request per connection (keep-alive off); a client that ends its sending side after its
//! request is still answered. Bounded:
//! - at most `METRICS_CONNECTIONS_MAX` connections at once: the accept loop closes more
//!   unanswered before hyper sees them;
//! - a request head (request line and headers) of at most `METRICS_REQUEST_BYTES_MAX` bytes:
//!   hyper's `max_header_size`, checked on what it has buffered after each read, answers a
//!   longer head with 431 (so the read buffer stays under twice the limit); and at most 100
//!   header lines (hyper's default; more are 431 too);
//! - `METRICS_REQUEST_TIMEOUT_MS` to read the request and send the answer: a timeout around
//!   the whole connection closes it where it stands (hyper's own header timeout is off).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keel_types::limits::{
    METRICS_CONNECTIONS_MAX, METRICS_REQUEST_BYTES_MAX, METRICS_REQUEST_TIMEOUT_MS,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::api::{console, health};
use crate::metrics::text::CONTENT_TYPE;
use crate::shared::Shared;

mod access;
mod scrape;

/// The console's page and data.
const PAGE_TYPE: &str = "text/html; charset=utf-8";
const JSON_TYPE: &str = "application/json";

/// Serves scrapes until the task is aborted (the connections' tasks with it).
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    serve_subject(listener, shared).await
}

/// What the endpoint reports on: the node (`Shared`), or a stand-in in the tests.
trait Subject: Send + Sync + 'static {
    /// The metrics in the text format.
    fn metrics(&self) -> impl Future<Output = String> + Send;
    /// For `/healthz`: whether the node is healthy and, after a start, the leaders settled
    /// (what `keel.raft.v1.Raft`'s health status says), else why not.
    fn live(&self) -> Result<(), String>;
    /// For `/readyz`: whether the node is healthy, every range hosted knows a leader and,
    /// until it first was, the leaders settled (the `""` status), else why not.
    fn ready(&self) -> Result<(), String>;
    /// For `/console/state.json`: the console's data, as JSON.
    fn console(self: Arc<Self>) -> impl Future<Output = String> + Send;
}

impl Subject for Shared {
    async fn metrics(&self) -> String {
        scrape::render(self).await
    }

    fn live(&self) -> Result<(), String> {
        health::node_verdict(self)
    }

    fn ready(&self) -> Result<(), String> {
        health::verdict(self)
    }

    async fn console(self: Arc<Self>) -> String {
        console::state(&self).await
    }
}

/// What a request asks for.
enum Asked {
    Metrics,
    Live,
    Ready,
    /// The console's page.
    Page,
    /// The console's data.
    ConsoleState,
    /// Another path: 404.
    NotFound,
    /// Another method: 405.
    MethodNotAllowed,
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
                    let served = serve_connection(stream, subject);
                    if tokio::time::timeout(limit, served).await.is_err() {
                        debug!(%peer, "metrics endpoint: request timed out");
                    }
                    drop(permit);
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Reads one request off `stream` and answers it.
async fn serve_connection<S: Subject>(stream: TcpStream, subject: Arc<S>) {
    let service = service_fn(move |request: Request<Incoming>| {
        let asked = route(request.method(), request.uri().path());
        let subject = subject.clone();
        async move { Ok::<_, Infallible>(answer(asked, subject).await) }
    });
    let served = http1::Builder::new()
        .keep_alive(false)
        // A client may end its sending side once its request is out (`nc`, a scripted probe):
        // answer it still, as the hand-written server did.
        .half_close(true)
        .max_header_size(METRICS_REQUEST_BYTES_MAX)
        // The timeout around the connection bounds reading the head too.
        .header_read_timeout(None)
        // As the hand-written server wrote them: `Content-Type`, no `Date`.
        .title_case_headers(true)
        .auto_date_header(false)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(error) = served.await {
        debug!(%error, "metrics endpoint: connection failed");
    }
}

/// What a request for `path` with `method` asks for.
fn route(method: &Method, path: &str) -> Asked {
    if method != Method::GET {
        return Asked::MethodNotAllowed;
    }
    match path {
        "/metrics" => Asked::Metrics,
        "/healthz" => Asked::Live,
        "/readyz" => Asked::Ready,
        "/" => Asked::Page,
        "/console/state.json" => Asked::ConsoleState,
        _ => Asked::NotFound,
    }
}

/// The answer to what a request asks for.
async fn answer<S: Subject>(asked: Asked, subject: Arc<S>) -> Response<String> {
    match asked {
        Asked::Metrics => text(StatusCode::OK, CONTENT_TYPE, subject.metrics().await),
        Asked::Live => probe(subject.live()),
        Asked::Ready => probe(subject.ready()),
        Asked::Page => text(StatusCode::OK, PAGE_TYPE, console::PAGE.to_string()),
        Asked::ConsoleState => text(StatusCode::OK, JSON_TYPE, subject.console().await),
        Asked::NotFound => text(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".into()),
        Asked::MethodNotAllowed => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        ),
    }
}

/// A probe's answer: 200 `ok`, or 503 with the reason.
fn probe(verdict: Result<(), String>) -> Response<String> {
    match verdict {
        Ok(()) => text(StatusCode::OK, "text/plain", "ok\n".to_string()),
        Err(reason) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("{reason}\n"),
        ),
    }
}

/// An answer of `status` with `body` as `content_type`; hyper adds its length.
fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let content_type = HeaderValue::from_static(content_type);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    response
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const METRICS: &str = "keel_up 1\n";
    const STATE: &str = "{\"nodes\":[]}";

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

        async fn console(self: Arc<Self>) -> String {
            STATE.to_string()
        }
    }

    /// Where an endpoint serving `Stub` listens, until the test's runtime ends.
    async fn start() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_subject(listener, Arc::new(Stub)));
        addr
    }

    /// Sends `request` on a new connection, ends the sending side (as `nc` does), and reads
    /// until the endpoint closes: its answer, or "" when it closed unanswered (a close that
    /// leaves the request unread reaches the client as a reset).
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

    /// An answer to an HTTP/1.1 request, as the endpoint writes it.
    fn http(status: &str, content_type: &str, body: &str) -> String {
        let length = body.len();
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nConnection: close\r\nContent-Length: {length}\r\n\r\n{body}"
        )
    }

    /// hyper's own answer to a request it cannot read: a status, nothing else.
    fn refused(status: &str) -> String {
        format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    }

    /// A request for `/metrics` whose head is `bytes` long with its end, or without it.
    fn head_of(bytes: usize, end: bool) -> String {
        let start = "GET /metrics HTTP/1.1\r\nX: ";
        let end = if end { "\r\n\r\n" } else { "" };
        let filler = "a".repeat(bytes - start.len() - end.len());
        format!("{start}{filler}{end}")
    }

    /// A request for `/metrics` with `count` header lines.
    fn headers_of(count: usize) -> String {
        format!("GET /metrics HTTP/1.1\r\n{}\r\n", "a: b\r\n".repeat(count))
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
        let page = http("200 OK", PAGE_TYPE, console::PAGE);
        let state = http("200 OK", JSON_TYPE, STATE);
        let not_allowed = http("405 Method Not Allowed", "text/plain", "GET only\n");
        // hyper answers HTTP/1.0 as HTTP/1.0 (which closes by default) and a HEAD request
        // without a body.
        let length = METRICS.len();
        let metrics_1_0 = format!(
            "HTTP/1.0 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {length}\r\n\r\n{METRICS}"
        );
        let not_allowed_head = not_allowed.replace("GET only\n", "");
        let bad = refused("400 Bad Request");
        let too_large = refused("431 Request Header Fields Too Large");
        // The head bound: a head of the limit is served, and one that reaches the limit
        // unfinished is refused. (One a byte longer, sent whole, would leave that byte unread,
        // so the close would reach the client as a reset, answer or not.)
        let at_limit = head_of(METRICS_REQUEST_BYTES_MAX, true);
        let unfinished_at_limit = head_of(METRICS_REQUEST_BYTES_MAX, false);
        let headers_max = headers_of(100);
        let headers_over = headers_of(101);
        let cases = [
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", metrics.as_str()),
            ("GET /metrics HTTP/1.0\r\n\r\n", &metrics_1_0),
            ("GET /metrics?name[]=x HTTP/1.1\r\n\r\n", &metrics),
            ("GET http://x/metrics HTTP/1.1\r\n\r\n", &metrics),
            ("GET /metrics HTTP/1.1\n\n", &metrics),
            (&at_limit, &metrics),
            (&headers_max, &metrics),
            ("GET /healthz HTTP/1.1\r\n\r\n", &live),
            ("GET /readyz HTTP/1.1\r\n\r\n", &not_ready),
            ("GET / HTTP/1.1\r\n\r\n", &page),
            ("GET /?x=1 HTTP/1.1\r\n\r\n", &page),
            ("GET /console/state.json HTTP/1.1\r\n\r\n", &state),
            ("GET /console HTTP/1.1\r\n\r\n", &not_found),
            ("GET /index.html HTTP/1.1\r\n\r\n", &not_found),
            ("POST / HTTP/1.1\r\n\r\n", &not_allowed),
            (
                "HEAD /console/state.json HTTP/1.1\r\n\r\n",
                &not_allowed_head,
            ),
            ("GET /metricsx HTTP/1.1\r\n\r\n", &not_found),
            ("POST /metrics HTTP/1.1\r\n\r\n", &not_allowed),
            (
                "POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                &not_allowed,
            ),
            ("HEAD /metrics HTTP/1.1\r\n\r\n", &not_allowed_head),
            ("GET /metrics HTTP/2\r\n\r\n", &bad),
            ("GET /metrics\r\n\r\n", &bad),
            ("hello\r\n\r\n", &bad),
            (&unfinished_at_limit, &too_large),
            (&headers_over, &too_large),
            // A connection that ends before its request head does: closed unanswered.
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n", ""),
            ("", ""),
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
