//! Per-RPC request metrics and the one place they are recorded: a tower layer around the
//! node's whole gRPC server. For every method of the Keel services the node serves (read
//! from the protos' file descriptor set, so a new RPC is metered without a change here) it
//! counts requests, errors by gRPC code and `KvError` kind, and observes the latency until
//! the response (the whole call for unary RPCs). Requests to other paths (health,
//! reflection, unknown methods) pass through uncounted, so the series stay one set per
//! method. The layer also opens each request's span (`rpc`, with `node_id`; `range_id`,
//! `term` and `log_index` are filled in where they become known). Knows nothing of what the
//! requests mean.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use keel_types::NodeId;
use prost::Message;
use tonic::{Code, Status};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;
use tracing::field::Empty;

use super::histogram::{Histogram, HistogramSnapshot, LATENCY_SECONDS};
use crate::status::{code_name, kv_error};

/// The package whose requests get debug-level spans: Raft traffic is frequent.
const RAFT_PACKAGE: &str = "keel.raft.v1";

/// The metrics of every metered method.
pub(crate) struct RequestMetrics {
    methods: Vec<MethodMetrics>,
    /// gRPC path (`/keel.v1.Kv/Put`) → index into `methods`.
    paths: HashMap<String, usize>,
}

pub(crate) struct MethodMetrics {
    /// Fully qualified: `keel.v1.Kv`.
    pub service: String,
    pub method: String,
    in_flight: AtomicI64,
    requests: AtomicU64,
    duration: Histogram,
    /// (gRPC code, `KvError` kind or "none") → errors.
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

/// One method's counters at one moment.
pub(crate) struct MethodSnapshot<'a> {
    pub service: &'a str,
    pub method: &'a str,
    pub in_flight: i64,
    pub requests: u64,
    pub duration: HistogramSnapshot,
    pub errors: Vec<((&'static str, &'static str), u64)>,
}

impl RequestMetrics {
    /// One set of metrics per method of the services in `descriptor_set` (an encoded
    /// `FileDescriptorSet`) that are `served` (fully qualified names).
    pub fn from_descriptor_set(descriptor_set: &[u8], served: &[&str]) -> RequestMetrics {
        let set = prost_types::FileDescriptorSet::decode(descriptor_set)
            .expect("the built-in file descriptor set decodes");
        let mut methods = Vec::new();
        for file in &set.file {
            for service in &file.service {
                let name = format!("{}.{}", file.package(), service.name());
                if !served.contains(&name.as_str()) {
                    continue;
                }
                for method in &service.method {
                    methods.push(MethodMetrics::new(&name, method.name()));
                }
            }
        }
        let paths = methods
            .iter()
            .enumerate()
            .map(|(index, m)| (format!("/{}/{}", m.service, m.method), index))
            .collect();
        RequestMetrics { methods, paths }
    }

    /// Every method's counters, in descriptor order.
    pub fn snapshot(&self) -> Vec<MethodSnapshot<'_>> {
        self.methods.iter().map(MethodMetrics::snapshot).collect()
    }

    fn index(&self, path: &str) -> Option<usize> {
        self.paths.get(path).copied()
    }
}

impl MethodMetrics {
    fn new(service: &str, method: &str) -> MethodMetrics {
        MethodMetrics {
            service: service.to_string(),
            method: method.to_string(),
            in_flight: AtomicI64::new(0),
            requests: AtomicU64::new(0),
            duration: Histogram::new(LATENCY_SECONDS),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    fn finish(&self, outcome: Outcome, elapsed: Duration) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.duration.observe_duration(elapsed);
        if let Outcome::Failed { code, kind } = outcome {
            let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
            *errors.entry((code, kind)).or_default() += 1;
        }
    }

    fn snapshot(&self) -> MethodSnapshot<'_> {
        let errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        MethodSnapshot {
            service: &self.service,
            method: &self.method,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            duration: self.duration.snapshot(),
            errors: errors.iter().map(|(key, count)| (*key, *count)).collect(),
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Failed {
        code: &'static str,
        kind: &'static str,
    },
}

impl Outcome {
    /// The outcome a response's headers carry: a `grpc-status` there is an error answered
    /// without a body (tonic answers every error so); without one, the status follows in the
    /// trailers, after a message: a success.
    pub fn of_headers(headers: &http::HeaderMap) -> Outcome {
        let Some(status) = Status::from_header_map(headers) else {
            return Outcome::Ok;
        };
        if status.code() == Code::Ok {
            return Outcome::Ok;
        }
        Outcome::Failed {
            code: code_name(status.code()),
            kind: kv_error(&status).map_or("none", |error| error.kind()),
        }
    }
}

/// The layer metering the server's requests.
#[derive(Clone)]
pub(crate) struct MeteredLayer {
    metrics: Arc<RequestMetrics>,
    node_id: NodeId,
}

impl MeteredLayer {
    pub fn new(metrics: Arc<RequestMetrics>, node_id: NodeId) -> MeteredLayer {
        MeteredLayer { metrics, node_id }
    }
}

impl<S> Layer<S> for MeteredLayer {
    type Service = Metered<S>;

    fn layer(&self, inner: S) -> Metered<S> {
        Metered {
            inner,
            metrics: self.metrics.clone(),
            node_id: self.node_id,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Metered<S> {
    inner: S,
    metrics: Arc<RequestMetrics>,
    node_id: NodeId,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Metered<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        let span = request_span(path, self.node_id);
        let call = Call::start(&self.metrics, path);
        let response = span.in_scope(|| self.inner.call(request));
        let answered = async move {
            let response = response.await;
            if let Some(call) = call {
                let outcome = match &response {
                    Ok(response) => Outcome::of_headers(response.headers()),
                    Err(_) => Outcome::Failed {
                        code: code_name(Code::Internal),
                        kind: "none",
                    },
                };
                call.finish(outcome);
            }
            response
        };
        Box::pin(answered.instrument(span))
    }
}

/// The span of one request: its path and the node; the services fill in the range, and
/// the Raft group the term and log index of a write.
fn request_span(path: &str, node_id: NodeId) -> tracing::Span {
    let raft = path
        .strip_prefix('/')
        .is_some_and(|path| path.starts_with(RAFT_PACKAGE));
    match raft {
        true => tracing::debug_span!("rpc", path, node_id),
        false => tracing::info_span!(
            "rpc",
            path,
            node_id,
            range_id = Empty,
            term = Empty,
            log_index = Empty
        ),
    }
}

/// A metered call in flight; dropped unfinished (the client went away, the server stopped)
/// it counts as `CANCELLED`.
struct Call {
    metrics: Arc<RequestMetrics>,
    index: usize,
    started: Instant,
    finished: bool,
}

impl Call {
    fn start(metrics: &Arc<RequestMetrics>, path: &str) -> Option<Call> {
        let index = metrics.index(path)?;
        metrics.methods[index]
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
        Some(Call {
            metrics: metrics.clone(),
            index,
            started: Instant::now(),
            finished: false,
        })
    }

    fn finish(mut self, outcome: Outcome) {
        self.finished = true;
        let elapsed = self.started.elapsed();
        tracing::debug!(?outcome, ?elapsed, "answered");
        self.metrics.methods[self.index].finish(outcome, elapsed);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.finished {
            let outcome = Outcome::Failed {
                code: code_name(Code::Cancelled),
                kind: "none",
            };
            self.metrics.methods[self.index].finish(outcome, self.started.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use keel_types::{KvError, RangeId};

    use super::*;
    use crate::status::to_status;

    fn metrics() -> RequestMetrics {
        let served = [
            "keel.v1.Kv",
            "keel.v1.Lock",
            "keel.v1.Idempotency",
            "keel.v1.Cluster",
        ];
        let served = [&served[..], &["keel.raft.v1.Raft"]].concat();
        RequestMetrics::from_descriptor_set(keel_proto::FILE_DESCRIPTOR_SET, &served)
    }

    #[test]
    fn every_rpc_of_the_protos_is_metered_once() {
        let metrics = metrics();
        let cases: &[(&str, bool)] = &[
            ("/keel.v1.Kv/Put", true),
            ("/keel.v1.Kv/Get", true),
            ("/keel.v1.Lock/Acquire", true),
            ("/keel.v1.Idempotency/Begin", true),
            ("/keel.v1.Cluster/Status", true),
            ("/keel.raft.v1.Raft/AppendEntries", true),
            ("/keel.raft.v1.Raft/InstallSnapshot", true),
            ("/grpc.health.v1.Health/Check", false),
            ("/keel.v1.Kv/Nope", false),
            ("/keel.test.v1.Faults/SetClockOffset", false),
            ("/", false),
        ];
        for (path, metered) in cases {
            assert_eq!(metrics.index(path).is_some(), *metered, "{path}");
        }
        let names: Vec<String> = metrics
            .snapshot()
            .iter()
            .map(|m| format!("{}/{}", m.service, m.method))
            .collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn outcomes_come_from_the_response_headers() {
        let not_leader = KvError::NotLeader {
            range_id: RangeId::FIRST,
            leader: None,
        };
        let cases: Vec<(Option<Status>, Outcome)> = vec![
            (None, Outcome::Ok),
            (Some(Status::ok("")), Outcome::Ok),
            (
                Some(to_status(&not_leader)),
                Outcome::Failed {
                    code: "unavailable",
                    kind: "not_leader",
                },
            ),
            (
                Some(to_status(&KvError::invalid("key is empty"))),
                Outcome::Failed {
                    code: "invalid_argument",
                    kind: "invalid_argument",
                },
            ),
            (
                Some(Status::unimplemented("no such method")),
                Outcome::Failed {
                    code: "unimplemented",
                    kind: "none",
                },
            ),
        ];
        for (status, expected) in cases {
            let mut headers = http::HeaderMap::new();
            if let Some(status) = &status {
                status.add_header(&mut headers).unwrap();
            }
            assert_eq!(Outcome::of_headers(&headers), expected, "{status:?}");
        }
    }

    #[test]
    fn calls_count_requests_errors_and_cancellations() {
        let metrics = Arc::new(metrics());
        let path = "/keel.v1.Kv/Put";
        Call::start(&metrics, path).unwrap().finish(Outcome::Ok);
        let failed = Outcome::Failed {
            code: "unavailable",
            kind: "not_leader",
        };
        Call::start(&metrics, path).unwrap().finish(failed);
        let in_flight = Call::start(&metrics, path).unwrap();
        drop(Call::start(&metrics, path).unwrap());
        assert!(Call::start(&metrics, "/keel.v1.Kv/Nope").is_none());
        let index = metrics.index(path).unwrap();
        let snapshot = metrics.methods[index].snapshot();
        assert_eq!(snapshot.requests, 3);
        assert_eq!(snapshot.in_flight, 1);
        assert_eq!(snapshot.duration.count(), 3);
        assert_eq!(
            snapshot.errors,
            vec![
                (("cancelled", "none"), 1),
                (("unavailable", "not_leader"), 1)
            ]
        );
        drop(in_flight);
    }
}
